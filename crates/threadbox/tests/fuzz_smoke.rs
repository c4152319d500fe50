//! The cargo-fuzz targets of `fuzz/` run on stable in CI: each body gets a few thousand
//! inputs (seeds from real traffic plus deterministic mutations of them). Longer runs:
//! `cd fuzz && cargo +nightly fuzz run <target>` (see docs/security.md).

mod proto_decoder {
    include!("../../../fuzz/bodies/proto_decoder.rs");
}
mod path_resolver {
    include!("../../../fuzz/bodies/path_resolver.rs");
}
mod api_json {
    include!("../../../fuzz/bodies/api_json.rs");
}

/// Inputs per target in CI (seconds in total).
const ITERATIONS: usize = 20_000;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// A mutation of one seed: bit flips, byte insertions/deletions, splices, truncation.
fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut v = seeds[rng.below(seeds.len())].clone();
    for _ in 0..=rng.below(8) {
        match rng.below(6) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(v.len() + 1);
                v.insert(i, rng.next() as u8);
            }
            2 if !v.is_empty() => {
                let i = rng.below(v.len());
                v.remove(i);
            }
            3 => {
                let other = &seeds[rng.below(seeds.len())];
                let at = rng.below(v.len() + 1);
                let from = rng.below(other.len() + 1);
                v.splice(at..at, other[from..].iter().copied());
            }
            4 => v.truncate(rng.below(v.len() + 1)),
            _ => {
                let i = rng.below(v.len() + 1);
                let tok: &[u8] = [
                    &b"../"[..],
                    b"/",
                    b"\0",
                    b"{",
                    b"}",
                    b"\"",
                    b"[",
                    b"1e999",
                    b"\xff",
                ][rng.below(9)];
                v.splice(i..i, tok.iter().copied());
            }
        }
    }
    v
}

fn run(seeds: Vec<Vec<u8>>, body: fn(&[u8])) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for s in &seeds {
        body(s);
    }
    for _ in 0..ITERATIONS {
        let input = mutate(&mut rng, &seeds);
        body(&input);
    }
}

#[test]
fn proto_decoder_survives_hostile_bytes() {
    let frames = [
        r#"{"t":"hello","version":1,"capabilities":["exec"]}"#,
        r#"{"t":"request","id":1,"cmd":{"c":"exec","argv":["sh","-c","echo hi"]}}"#,
        r#"{"t":"response","id":7,"resp":{"r":"done"}}"#,
        r#"{"t":"request","id":18446744073709551615,"cmd":null}"#,
    ];
    let mut seeds: Vec<Vec<u8>> = frames
        .iter()
        .map(|f| {
            let mut v = (f.len() as u32).to_be_bytes().to_vec();
            v.extend_from_slice(f.as_bytes());
            v
        })
        .collect();
    seeds.push(vec![0xff, 0xff, 0xff, 0xff, b'{']);
    seeds.push(vec![0, 0, 0, 0]);
    run(seeds, proto_decoder::run);
}

#[test]
fn path_resolver_never_leaves_the_root() {
    let seeds = [
        "/home/user/a.txt",
        "../../../../etc/shadow",
        "/proc/../proc/self/mem",
        "a/./b//c/../../../../../..",
        "/dev/../../sys/kernel",
        "",
        "/",
        "\0",
        "//proc",
        "./.././../proc",
    ];
    run(
        seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
        path_resolver::run,
    );
    // Over-long paths are refused, not truncated.
    let long = "a/".repeat(3000);
    assert!(threadbox_agent::path::normalize(&long, "/home/user").is_err());
}

#[test]
fn api_json_parses_or_refuses_cleanly() {
    let seeds = [
        r#"{"name":"a","labels":{"k":"v"},"limits":{"memory_bytes":1073741824,"cpus":0.5,"pids":64,"disk_bytes":1048576}}"#,
        r#"{"command":["python3","-c","print(1)"],"env":{"A":"B"},"timeout_secs":1.5,"max_output_bytes":10}"#,
        r#"{"shell":"echo hi","user":"root","stdin":"aGk=","stdin_encoding":"base64"}"#,
        r#"{"limits":{"memory_bytes":-1}}"#,
        r#"[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]"#,
        r#"{"ttl_action":"delete","ttl_secs":18446744073709551616}"#,
    ];
    run(
        seeds.iter().map(|s| s.as_bytes().to_vec()).collect(),
        api_json::run,
    );
}
