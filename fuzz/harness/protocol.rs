//! Target `protocol`: the JSON-lines query protocol of `infini-sidecar query` (`run_batch`,
//! `answer_line`) over a tiny two-part index with a tokenizer. The input is the batch's input.
//! Besides not panicking, a batch keeps the protocol's promise: one JSON object per non-blank line.

use std::path::Path;

use infini_sidecar::index::{Index, OpenOptions, TokenWidth};
use infini_sidecar::protocol::{answer_line, run_batch};

use super::tiny;

pub struct Fixture {
    index: Index,
}

impl Fixture {
    /// Builds the index in `dir`, which must outlive the fixture.
    pub fn new(dir: &Path) -> Self {
        let tokenizer = tiny::tokenizer(dir);
        let spec = tiny::Spec {
            width: TokenWidth::U16,
            eos: tiny::EOS,
            vocab: tiny::VOCAB,
            tokenizer: Some(&tokenizer),
            docs: tiny::documents(40, &tiny::WORDS),
            part_tokens: 128,
        };
        let path = tiny::build_index(dir, "protocol-index", &spec);
        let index = Index::open(&path, &OpenOptions::default()).unwrap();
        assert!(index.num_parts() > 1);
        Fixture { index }
    }

    pub fn run(&self, input: &[u8]) {
        let mut output = Vec::new();
        run_batch(&self.index, input, &mut output, false)
            .expect("a batch over in-memory input and output cannot fail");
        let answers: Vec<&str> = std::str::from_utf8(&output)
            .expect("answers are UTF-8")
            .lines()
            .collect();
        // A line that is not UTF-8 is answered in place too; the count is checked where the
        // input's lines can be told apart as text.
        let text = std::str::from_utf8(input).unwrap_or_default();
        let asked: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        if !text.is_empty() {
            assert_eq!(answers.len(), asked.len(), "one answer per non-blank line");
        }
        for answer in answers {
            let value: serde_json::Value = serde_json::from_str(answer).expect("answers are JSON");
            assert!(value.is_object(), "an answer is a JSON object: {answer}");
        }
        if let Some(first) = asked.first() {
            let timed: serde_json::Value =
                serde_json::from_str(&answer_line(&self.index, first, true)).unwrap();
            assert!(timed.is_object());
        }
    }
}

/// One line per query kind, good and bad, over ids the index holds (see `tiny::WORDS`).
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let lines: &[(&str, &str)] = &[
        ("count", r#"{"op":"count","ids":[259,260],"qid":1}"#),
        ("prob", r#"{"op":"prob","prompt":[259],"cont":260}"#),
        ("ntd", r#"{"op":"ntd","prompt":[257,258],"max_support":4}"#),
        ("infgram", "{\"op\":\"infgram_prob\",\"prompt\":[97,98,259],\"cont\":46}\n{\"op\":\"infgram_ntd\",\"prompt\":[46,97]}"),
        ("find", r#"{"op":"find","ids":[32]}"#),
        ("search", r#"{"op":"search_docs","cnf":[[[259],[260,261]],[[97]]],"maxnum":3,"max_disp_len":4,"max_clause_freq":2}"#),
        ("search-ids", r#"{"op":"search_docs","ids":[[[258]],[[98]]]}"#),
        ("trace", r#"{"op":"trace","ids":[259,97,98,97],"min_len":1,"maxnum":2,"max_disp_len":4}"#),
        ("trace-text", r#"{"op":"trace","text":"a b a b","min_len":2}"#),
        ("get-doc", "{\"op\":\"get_doc\",\"doc_ix\":0}\n{\"op\":\"get_doc\",\"doc_ix\":39}\n{\"op\":\"get_doc\",\"doc_ix\":40}"),
        ("score", r#"{"op":"score","ids":[259,97,256,98,261]}"#),
        ("errors", "{\"op\":\"count\",\"ids\":[-1]}\n[1,2]\nnot json\n\n{\"op\":\"nope\",\"error\":1}\r\n{\"ids\":[1]}"),
    ];
    lines
        .iter()
        .map(|(name, text)| (*name, text.as_bytes().to_vec()))
        .collect()
}
