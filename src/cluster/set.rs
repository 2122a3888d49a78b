//! The shards a router finds must be one set built together: the same set, tokenizer and ids,
//! every shard of it present, replicas of a shard holding the same files. Anything else would
//! merge counts of different corpora or tokenizers into silently wrong answers, so it is refused.

use std::collections::BTreeMap;

/// What a shard server says of itself (`sidecar.shard.v1.ShardDescription`, less the tokenizer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardIdentity {
    pub set_id: String,
    pub shard: u32,
    pub shards: u32,
    pub documents: u64,
    pub tokens: u64,
    pub local_parts: u32,
    pub token_width: u32,
    pub eos_token_id: u32,
    pub vocab_size: u64,
    pub tokenizer_fingerprint: String,
    pub content_id: String,
}

/// Why the shards found do not make one set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetError {
    #[error("no shard server answered")]
    Empty,
    #[error("{0} and {1} are not shards of one set: {2}")]
    Mismatch(String, String, String),
    #[error("shard {shard} of {shards} has no replica that answers{}", if .seen.is_empty() { String::new() } else { format!(" (found {})", .seen) })]
    Missing {
        shard: u32,
        shards: u32,
        seen: String,
    },
}

/// The set the shards make: per shard its replicas' addresses and its identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetLayout {
    pub shards: Vec<(ShardIdentity, Vec<String>)>,
}

impl SetLayout {
    /// Per shard, the documents of the shards before it: what its document numbers start from.
    pub fn doc_bases(&self) -> Vec<u64> {
        self.shards
            .iter()
            .scan(0u64, |base, (id, _)| {
                let this = *base;
                *base += id.documents;
                Some(this)
            })
            .collect()
    }

    pub fn first(&self) -> &ShardIdentity {
        &self.shards[0].0
    }
}

/// The fields two shards of a set share, and how they differ, or `None`.
fn differs(a: &ShardIdentity, b: &ShardIdentity) -> Option<String> {
    let checks: [(&str, String, String); 6] = [
        ("set id", a.set_id.clone(), b.set_id.clone()),
        ("shard count", a.shards.to_string(), b.shards.to_string()),
        (
            "token width",
            a.token_width.to_string(),
            b.token_width.to_string(),
        ),
        (
            "eos token",
            a.eos_token_id.to_string(),
            b.eos_token_id.to_string(),
        ),
        (
            "vocabulary",
            a.vocab_size.to_string(),
            b.vocab_size.to_string(),
        ),
        (
            "tokenizer",
            a.tokenizer_fingerprint.clone(),
            b.tokenizer_fingerprint.clone(),
        ),
    ];
    checks
        .into_iter()
        .find(|(_, x, y)| x != y)
        .map(|(what, x, y)| format!("{what} {x} vs {y}"))
}

/// Groups the shard servers that answered (address, identity) into a set, or says why they are not
/// one: a shard of another set, a replica with other files, a shard missing.
pub fn assemble(members: &[(String, ShardIdentity)]) -> Result<SetLayout, SetError> {
    let (first_addr, first) = members.first().ok_or(SetError::Empty)?;
    let mut by_shard: BTreeMap<u32, (ShardIdentity, Vec<String>)> = BTreeMap::new();
    for (addr, id) in members {
        if let Some(why) = differs(first, id) {
            return Err(SetError::Mismatch(first_addr.clone(), addr.clone(), why));
        }
        match by_shard.get_mut(&id.shard) {
            Some((known, addrs)) => {
                if known.content_id != id.content_id {
                    return Err(SetError::Mismatch(
                        addrs[0].clone(),
                        addr.clone(),
                        format!("both say shard {}, with different files", id.shard),
                    ));
                }
                if !addrs.contains(addr) {
                    addrs.push(addr.clone());
                }
            }
            None => {
                by_shard.insert(id.shard, (id.clone(), vec![addr.clone()]));
            }
        }
    }
    let shards = first.shards;
    if let Some(missing) = (0..shards).find(|k| !by_shard.contains_key(k)) {
        return Err(SetError::Missing {
            shard: missing,
            shards,
            seen: by_shard
                .keys()
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    if let Some(&extra) = by_shard.keys().find(|&&k| k >= shards) {
        return Err(SetError::Mismatch(
            first_addr.clone(),
            by_shard[&extra].1[0].clone(),
            format!("shard {extra} in a set of {shards}"),
        ));
    }
    Ok(SetLayout {
        shards: by_shard.into_values().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(shard: u32, shards: u32) -> ShardIdentity {
        ShardIdentity {
            set_id: "s".into(),
            shard,
            shards,
            documents: 10 + shard as u64,
            tokens: 100,
            local_parts: 1,
            token_width: 2,
            eos_token_id: 0,
            vocab_size: 49152,
            tokenizer_fingerprint: "t".into(),
            content_id: format!("c{shard}"),
        }
    }

    fn at(addr: &str, id: ShardIdentity) -> (String, ShardIdentity) {
        (addr.to_string(), id)
    }

    #[test]
    fn a_complete_set_groups_replicas_and_numbers_documents_in_shard_order() {
        let layout = assemble(&[
            at("b", id(1, 3)),
            at("a", id(0, 3)),
            at("c", id(2, 3)),
            at("b2", id(1, 3)),
        ])
        .unwrap();
        let addrs: Vec<Vec<String>> = layout.shards.iter().map(|(_, a)| a.clone()).collect();
        assert_eq!(addrs, vec![vec!["a"], vec!["b", "b2"], vec!["c"]]);
        assert_eq!(layout.doc_bases(), vec![0, 10, 21]);
    }

    #[test]
    fn shards_not_built_together_are_refused() {
        assert!(matches!(
            assemble(&[at("a", id(0, 2))]),
            Err(SetError::Missing { shard: 1, .. })
        ));
        let mut other = id(1, 2);
        other.set_id = "other".into();
        assert!(matches!(
            assemble(&[at("a", id(0, 2)), at("b", other)]),
            Err(SetError::Mismatch(..))
        ));
        let mut tok = id(1, 2);
        tok.tokenizer_fingerprint = "u".into();
        assert!(assemble(&[at("a", id(0, 2)), at("b", tok)]).is_err());
        let mut twin = id(0, 2);
        twin.content_id = "different".into();
        assert!(matches!(
            assemble(&[at("a", id(0, 2)), at("b", twin), at("c", id(1, 2))]),
            Err(SetError::Mismatch(..))
        ));
        assert_eq!(assemble(&[]), Err(SetError::Empty));
    }
}
