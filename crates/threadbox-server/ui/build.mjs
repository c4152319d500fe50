// Builds the dashboard into dist/ (committed; CI rebuilds and diffs it: scripts/ui-check.sh).
import { build } from "esbuild";
import { copyFileSync, mkdirSync } from "node:fs";

mkdirSync("dist", { recursive: true });
const common = { bundle: true, minify: true, legalComments: "eof", logLevel: "warning" };
await build({ ...common, entryPoints: ["src/app.js"], outfile: "dist/app.js", format: "iife", target: "es2022" });
await build({ ...common, entryPoints: ["src/app.css"], outfile: "dist/app.css" });
for (const f of ["index.html", "login.html"]) copyFileSync(`src/${f}`, `dist/${f}`);
