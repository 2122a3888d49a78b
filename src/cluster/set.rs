//! The shards a router finds must be one set built together: the same set, tokenizer and ids,
//! every shard of it present, replicas of a shard holding the same files. A server that disagrees
//! would merge counts of another corpus or tokenizer into silently wrong answers, so it is left
//! out of the set (and named); a set with a shard missing is refused.

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
    #[error("shard {shard} of {shards} has no replica that answers{}", if .seen.is_empty() { String::new() } else { format!(" (found {})", .seen) })]
    Missing {
        shard: u32,
        shards: u32,
        seen: String,
    },
}

/// A shard server left out of the set, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stray {
    pub address: String,
    pub why: String,
}

/// The set the shards form, and the servers that disagree with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assembled {
    pub layout: SetLayout,
    pub strays: Vec<Stray>,
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

/// Groups the shard servers that answered (address, identity) into a set. A server that disagrees
/// with it (another set, tokenizer or vocabulary; other files than its shard's other replicas; a
/// shard number past the set's) is left out as a stray rather than refusing the whole set: one
/// leftover or mis-addressed pod must not take a cluster down. Which set, and which files of a
/// shard, win: those `previous` accepted when some server still has them (so a stray cannot
/// displace a working set), else those the most servers have (the first found on a tie). Refused
/// only when no server answered or a shard has no replica left.
pub fn assemble(
    members: &[(String, ShardIdentity)],
    previous: Option<&SetLayout>,
) -> Result<Assembled, SetError> {
    let first = winner(
        members.iter().map(|(_, id)| id),
        previous.map(SetLayout::first),
        |a, b| differs(a, b).is_none(),
    )
    .ok_or(SetError::Empty)?;
    let mut strays = Vec::new();
    let mut by_shard: BTreeMap<u32, Vec<(&String, &ShardIdentity)>> = BTreeMap::new();
    for (addr, id) in members {
        let why = match differs(first, id) {
            Some(why) => Some(why),
            None if id.shard >= first.shards => {
                Some(format!("shard {} in a set of {}", id.shard, first.shards))
            }
            None => None,
        };
        match why {
            Some(why) => strays.push(Stray {
                address: addr.clone(),
                why,
            }),
            None => by_shard.entry(id.shard).or_default().push((addr, id)),
        }
    }
    let mut shards = Vec::new();
    for (k, replicas) in &by_shard {
        let before = previous
            .and_then(|p| p.shards.get(*k as usize))
            .map(|(id, _)| id);
        let files = winner(replicas.iter().map(|(_, id)| *id), before, |a, b| {
            a.content_id == b.content_id
        })
        .ok_or(SetError::Empty)?;
        let mut addrs = Vec::new();
        for (addr, id) in replicas {
            if id.content_id != files.content_id {
                strays.push(Stray {
                    address: (*addr).clone(),
                    why: format!("other files than shard {k}'s other replicas"),
                });
            } else if !addrs.contains(*addr) {
                addrs.push((*addr).clone());
            }
        }
        shards.push((files.clone(), addrs));
    }
    if let Some(missing) = (0..first.shards).find(|k| !by_shard.contains_key(k)) {
        return Err(SetError::Missing {
            shard: missing,
            shards: first.shards,
            seen: by_shard
                .keys()
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(Assembled {
        layout: SetLayout { shards },
        strays,
    })
}

/// Among `ids`, the one `before` agrees with when some does, else the one most others agree with
/// (the first on a tie); `None` when there are none.
fn winner<'a>(
    ids: impl Iterator<Item = &'a ShardIdentity> + Clone,
    before: Option<&ShardIdentity>,
    same: impl Fn(&ShardIdentity, &ShardIdentity) -> bool,
) -> Option<&'a ShardIdentity> {
    if let Some(kept) = before.and_then(|b| ids.clone().find(|id| same(b, id))) {
        return Some(kept);
    }
    let agreeing = |id: &ShardIdentity| ids.clone().filter(|other| same(id, other)).count();
    ids.clone()
        .enumerate()
        .max_by_key(|&(i, id)| (agreeing(id), std::cmp::Reverse(i)))
        .map(|(_, id)| id)
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

    fn strays(a: &Assembled) -> Vec<&str> {
        a.strays.iter().map(|s| s.address.as_str()).collect()
    }

    #[test]
    fn a_complete_set_groups_replicas_and_numbers_documents_in_shard_order() {
        let layout = assemble(
            &[
                at("b", id(1, 3)),
                at("a", id(0, 3)),
                at("c", id(2, 3)),
                at("b2", id(1, 3)),
            ],
            None,
        )
        .unwrap()
        .layout;
        let addrs: Vec<Vec<String>> = layout.shards.iter().map(|(_, a)| a.clone()).collect();
        assert_eq!(addrs, vec![vec!["a"], vec!["b", "b2"], vec!["c"]]);
        assert_eq!(layout.doc_bases(), vec![0, 10, 21]);
    }

    /// A server of another set, tokenizer or build, or with other files than its shard's other
    /// replicas, is left out and named; the set forms from the rest. Only a shard with no replica
    /// left, or no server at all, refuses the set.
    #[test]
    fn strays_are_left_out_and_the_set_forms_from_the_rest() {
        let mut other = id(1, 2);
        other.set_id = "other".into();
        let mut tok = id(1, 2);
        tok.tokenizer_fingerprint = "u".into();
        let formed = assemble(
            &[
                at("a", id(0, 2)),
                at("x", other.clone()),
                at("b", id(1, 2)),
                at("y", tok),
                at("z", id(2, 2)),
            ],
            None,
        )
        .unwrap();
        assert_eq!(strays(&formed), vec!["x", "y", "z"]);
        assert_eq!(formed.layout.shards[1].1, vec!["b"]);
        assert!(
            formed.strays[0].why.contains("set id"),
            "{:?}",
            formed.strays
        );

        // Replicas of a shard with other files: the files most of them hold win.
        let mut twin = id(0, 2);
        twin.content_id = "different".into();
        let formed = assemble(
            &[
                at("a", twin.clone()),
                at("a2", id(0, 2)),
                at("a3", id(0, 2)),
                at("b", id(1, 2)),
            ],
            None,
        )
        .unwrap();
        assert_eq!(strays(&formed), vec!["a"]);
        assert_eq!(formed.layout.shards[0].1, vec!["a2", "a3"]);

        // What a router accepted before wins over more servers that disagree with it.
        let accepted = formed.layout;
        let again = assemble(
            &[
                at("a", twin.clone()),
                at("a4", twin),
                at("a2", id(0, 2)),
                at("b", id(1, 2)),
                at("x", other.clone()),
                at("x2", other),
            ],
            Some(&accepted),
        )
        .unwrap();
        assert_eq!(strays(&again), vec!["x", "x2", "a", "a4"]);
        assert_eq!(
            again.layout,
            SetLayout {
                shards: vec![(id(0, 2), vec!["a2".into()]), (id(1, 2), vec!["b".into()])],
            }
        );

        assert!(matches!(
            assemble(&[at("a", id(0, 2))], None),
            Err(SetError::Missing { shard: 1, .. })
        ));
        assert_eq!(assemble(&[], None), Err(SetError::Empty));
    }
}
