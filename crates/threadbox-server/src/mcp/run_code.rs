//! The `run_code` tool (issue 15, ADR 0085): a cell in a persistent context, its result
//! as the model reads it (text), the images it made (`ImageContent`) and the typed
//! result (`structuredContent`, a `CodeExecution` whose image bytes are not repeated).

use super::backend::{Backend, BackendError};
use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use threadbox_api::interp::{
    CodeExecution, CodeOutput, CodeStatus, CreateContextRequest, ExecuteCodeRequest,
};

/// The context `run_code` uses when the caller names none (made on first use).
pub const DEFAULT_CONTEXT: &str = "python";
/// Cell timeout when the caller gives none, in seconds.
pub const DEFAULT_CELL_TIMEOUT_SECS: u64 = 300;
/// Bound on stdout and stderr of a cell, each (what a model can use).
pub const MAX_CELL_OUTPUT_BYTES: u64 = 1 << 20;
/// At most this many images become `ImageContent` blocks; later ones are named only.
pub const MAX_IMAGES: usize = 8;
/// Bound on the base64 bytes of all the images of one call.
pub const MAX_IMAGE_BYTES: usize = 8 << 20;
/// Bound on the text of one displayed value in the text content.
const MAX_VALUE_TEXT: usize = 16 << 10;

/// MIME types sent as `ImageContent` (what chat models accept as images). SVG stays
/// text: most models refuse it as an image.
const IMAGE_MIMES: &[&str] = &["image/png", "image/jpeg", "image/gif", "image/webp"];

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// Id (`sb-…`) or name of the sandbox.
    pub sandbox: String,
    /// The code of one cell. The value of the last expression is returned (end it with
    /// `;` to suppress it); `display()` and matplotlib figures come back as outputs.
    pub code: String,
    /// Name of the context (default `python`). Variables, imports and open files persist
    /// between calls with the same context; a new name starts an independent context.
    pub context: Option<String>,
    /// Language of a new context: `python` (default), `javascript` (node) or `bash`.
    /// Without `context`, the language's own context of that name is used.
    pub language: Option<String>,
    /// Running seconds after which the cell is interrupted, keeping the context's
    /// variables when it stops (default 300).
    pub timeout_secs: Option<u64>,
    /// Environment variables set for this cell only.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// Runs the tool: get-or-create the context when it is not the default one, execute.
pub(super) async fn run_code(
    backend: &dyn Backend,
    a: RunCodeArgs,
) -> Result<CallToolResult, BackendError> {
    let language = a.language.unwrap_or_else(|| "python".to_string());
    // Without a context, a language's own context (`javascript`, `bash`), not a
    // `python` context of another language.
    let context = a.context.filter(|c| !c.is_empty()).unwrap_or_else(|| {
        threadbox_api::interp::canonical_language(&language)
            .unwrap_or(DEFAULT_CONTEXT)
            .to_string()
    });
    // `python` is made by its first execute; any other name (or language) is made here,
    // get-or-create, so the model never has to call a separate tool first.
    let create =
        (context != DEFAULT_CONTEXT || language != "python").then(|| CreateContextRequest {
            name: Some(context.clone()),
            language,
            cwd: None,
            env: BTreeMap::new(),
            user: Default::default(),
        });
    let timeout = a.timeout_secs.unwrap_or(DEFAULT_CELL_TIMEOUT_SECS);
    let request = ExecuteCodeRequest {
        code: a.code,
        env: a.env,
        timeout_secs: Some(timeout),
        max_output_bytes: Some(MAX_CELL_OUTPUT_BYTES),
    };
    let exec = backend
        .run_code(&a.sandbox, &context, create, request)
        .await?;
    Ok(cell_result(&context, timeout, exec))
}

/// One cell's outcome as a tool result: a text block, then one `ImageContent` per image
/// (bounded), and the execution as `structuredContent` with each image's bytes replaced
/// by the index of its content block (`metadata.threadbox.content_block`).
pub fn cell_result(context: &str, timeout: u64, mut exec: CodeExecution) -> CallToolResult {
    let mut text = status_line(context, timeout, &exec);
    let mut images: Vec<ContentBlock> = Vec::new();
    let mut image_bytes = 0usize;
    let mut images_left_out = 0usize;

    push_stream(&mut text, "stdout", &exec.stdout);
    push_stream(&mut text, "stderr", &exec.stderr);
    let mut take = |out: &mut CodeOutput, label: &str, text: &mut String| {
        for mime in IMAGE_MIMES {
            let Some(Value::String(data)) = out.data.get(*mime) else {
                continue;
            };
            if images.len() >= MAX_IMAGES || image_bytes + data.len() > MAX_IMAGE_BYTES {
                images_left_out += 1;
                text.push_str(&format!(
                    "\n[{label}: {mime} image, not sent (too many images)]"
                ));
                continue;
            }
            image_bytes += data.len();
            // Content block 0 is the text, so the k-th image is block k.
            images.push(ContentBlock::image(data.clone(), *mime));
            let block = images.len();
            out.data.remove(*mime);
            let meta = out
                .metadata
                .entry("threadbox")
                .or_insert_with(|| Value::Object(Default::default()));
            if let Value::Object(m) = meta {
                let blocks = m
                    .entry("content_block")
                    .or_insert_with(|| Value::Object(Default::default()));
                if let Value::Object(b) = blocks {
                    b.insert((*mime).to_string(), block.into());
                }
            }
            text.push_str(&format!("\n[{label}: {mime} image, content block {block}]"));
        }
        if let Some(plain) = value_text(out) {
            text.push_str(&format!("\n{label}:\n{plain}"));
        }
    };
    for (i, out) in exec.outputs.iter_mut().enumerate() {
        take(out, &format!("display {}", i + 1), &mut text);
    }
    if let Some(result) = exec.result.as_mut() {
        take(result, "result", &mut text);
    }
    if let Some(e) = &exec.exception {
        let tb = if e.traceback.is_empty() {
            format!("{}: {}", e.name, e.value)
        } else {
            e.traceback.trim_end().to_string()
        };
        text.push_str(&format!("\nexception:\n{tb}"));
    }
    if exec.truncated {
        text.push_str(&format!(
            "\n[output truncated: at most {MAX_CELL_OUTPUT_BYTES} bytes per stream; write \
             large output to a file and read parts of it]"
        ));
    }
    if images_left_out > 0 {
        text.push_str(&format!(
            "\n[{images_left_out} image(s) not sent: at most {MAX_IMAGES} images and \
             {MAX_IMAGE_BYTES} bytes per call; save figures to files instead]"
        ));
    }
    let mut content = vec![ContentBlock::text(text)];
    content.extend(images);
    let mut result = CallToolResult::success(content);
    result.structured_content = serde_json::to_value(&exec).ok();
    result
}

fn status_line(context: &str, timeout: u64, e: &CodeExecution) -> String {
    let mut line = match e.status {
        CodeStatus::Ok => format!("ok (context {context}, cell {})", e.execution_count),
        CodeStatus::Exception => {
            let name = e
                .exception
                .as_ref()
                .map_or("Exception", |x| x.name.as_str());
            format!(
                "exception {name} (context {context}, cell {}): the context keeps its \
                 variables",
                e.execution_count
            )
        }
        CodeStatus::Interrupted => format!("interrupted (context {context})"),
        CodeStatus::TimedOut => format!(
            "timed out after {timeout}s of running time: the cell was interrupted (pass a \
             larger timeout_secs)"
        ),
        CodeStatus::ContextDied => format!(
            "the context {context} died during the cell ({}): every variable is gone",
            e.reason.as_deref().unwrap_or("unknown reason")
        ),
    };
    if e.context_restarted {
        line.push_str(
            "\n[the cell did not stop, so the context was restarted: every variable is gone]",
        );
    } else if e.context_created && e.execution_count > 0 {
        line.push_str("\n[a new context was started for this cell]");
    }
    line
}

fn push_stream(text: &mut String, name: &str, s: &str) {
    if !s.is_empty() {
        text.push_str(&format!("\n{name}:\n{}", s.trim_end_matches('\n')));
    }
}

/// The text a model reads for a value: `text/plain`, else markdown or HTML, bounded.
fn value_text(out: &CodeOutput) -> Option<String> {
    let s = ["text/plain", "text/markdown", "text/html", "image/svg+xml"]
        .iter()
        .find_map(|m| out.data.get(*m).and_then(Value::as_str))
        .map(str::to_string)
        .or_else(|| out.data.get("application/json").map(|v| v.to_string()))?;
    if s.len() <= MAX_VALUE_TEXT {
        return Some(s);
    }
    let mut cut = MAX_VALUE_TEXT;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    Some(format!("{}\n[… {} more bytes]", &s[..cut], s.len() - cut))
}
