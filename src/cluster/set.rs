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
    #[error("shard {shard} of {shards} has no replica that answers{}{}", if .seen.is_empty() { String::new() } else { format!(" (found {})", .seen) }, if .strays.is_empty() { String::new() } else { format!("; left out: {}", .strays) })]
    Missing {
        shard: u32,
        shards: u32,
        seen: String,
        /// The servers left out of the set, and why.
        strays: String,
    },
}

/// A shard server a router found: its address, what it said of itself, and whether it answered
/// this time (one that did not keeps what it said last, so a shard down is named, not forgotten).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub address: String,
    pub identity: ShardIdentity,
    pub answering: bool,
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

/// Groups the shard servers found into a set. The servers that agree on the set-wide fields (set
/// id, shard count, tokenizer, ids) are a candidate; a server that disagrees with the one chosen,
/// or has other files than its shard's other replicas, or a shard number past the set's, is left
/// out as a stray rather than refusing the whole set: one leftover or mis-addressed pod must not
/// take a cluster down. The chosen set is complete: first among the sets complete with servers that
/// answer now, then among those complete with the servers known; within each, the set accepted
/// before (so a stray cannot displace a working set), else the one most servers answering agree on,
/// else the first found. The same rule picks a shard's files among its replicas. Refused only when
/// no candidate is complete: the reason is the preferred candidate's.
pub fn assemble(members: &[Member], previous: Option<&SetLayout>) -> Result<Assembled, SetError> {
    let mut candidates: Vec<&ShardIdentity> = Vec::new();
    for m in members {
        if !candidates.iter().any(|c| differs(c, &m.identity).is_none()) {
            candidates.push(&m.identity);
        }
    }
    let answering = |set: &ShardIdentity| {
        (members.iter())
            .filter(|m| m.answering && differs(set, &m.identity).is_none())
            .count()
    };
    let accepted = |set: &ShardIdentity| {
        previous.is_some_and(|p| {
            p.shards
                .first()
                .is_some_and(|(id, _)| differs(id, set).is_none())
        })
    };
    // Most preferred first: accepted before, then most servers answering, then first found.
    let mut order: Vec<(usize, &ShardIdentity)> = candidates.into_iter().enumerate().collect();
    order.sort_by_key(|&(i, set)| (!accepted(set), std::cmp::Reverse(answering(set)), i));
    let mut first_error = None;
    for only_answering in [true, false] {
        for &(_, set) in &order {
            match form(set, members, previous, only_answering) {
                Ok(assembled) => return Ok(assembled),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
    }
    Err(first_error.unwrap_or(SetError::Empty))
}

/// The set `set` describes, from `members`: complete with those answering now alone when
/// `only_answering`. Either way a shard's replicas that are down but known (described before) stay
/// in its list behind the others: a live append must reach every replica of its shard, and one
/// that went missing from the list while down would come back without what it missed.
fn form(
    set: &ShardIdentity,
    members: &[Member],
    previous: Option<&SetLayout>,
    only_answering: bool,
) -> Result<Assembled, SetError> {
    let mut strays = Vec::new();
    let mut by_shard: BTreeMap<u32, Vec<&Member>> = BTreeMap::new();
    let mut resting: BTreeMap<u32, Vec<&Member>> = BTreeMap::new();
    for m in members {
        let id = &m.identity;
        let why = match differs(set, id) {
            Some(why) => Some(why),
            None if id.shard >= set.shards => {
                Some(format!("shard {} in a set of {}", id.shard, set.shards))
            }
            None => None,
        };
        match why {
            Some(why) => strays.push(Stray {
                address: m.address.clone(),
                why,
            }),
            None if only_answering && !m.answering => resting.entry(id.shard).or_default().push(m),
            None => by_shard.entry(id.shard).or_default().push(m),
        }
    }
    let mut shards = Vec::new();
    for (k, replicas) in &by_shard {
        let before = previous
            .and_then(|p| p.shards.get(*k as usize))
            .map(|(id, _)| id);
        let kept = before.and_then(|b| {
            replicas
                .iter()
                .find(|m| m.identity.content_id == b.content_id)
        });
        let holders = |m: &Member| {
            (replicas.iter())
                .filter(|r| r.answering && r.identity.content_id == m.identity.content_id)
                .count()
        };
        let files = match kept {
            Some(m) => &m.identity,
            None => {
                let mut ranked: Vec<(usize, &&Member)> = replicas.iter().enumerate().collect();
                ranked.sort_by_key(|&(i, m)| (std::cmp::Reverse(holders(m)), i));
                &ranked[0].1.identity
            }
        };
        let mut addrs = Vec::new();
        for m in replicas {
            if m.identity.content_id != files.content_id {
                strays.push(Stray {
                    address: m.address.clone(),
                    why: format!("other files than shard {k}'s other replicas"),
                });
            } else if !addrs.contains(&m.address) {
                addrs.push(m.address.clone());
            }
        }
        // Down replicas with the shard's files; others are passed over until they answer.
        for m in resting.get(k).into_iter().flatten() {
            if m.identity.content_id == files.content_id && !addrs.contains(&m.address) {
                addrs.push(m.address.clone());
            }
        }
        shards.push((files.clone(), addrs));
    }
    let missing = match set.shards {
        0 => Some(0),
        n => (0..n).find(|k| !by_shard.contains_key(k)),
    };
    if let Some(missing) = missing {
        return Err(SetError::Missing {
            shard: missing,
            shards: set.shards,
            seen: (by_shard.keys())
                .map(|k| k.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            strays: (strays.iter())
                .map(|s| format!("{} ({})", s.address, s.why))
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(Assembled {
        layout: SetLayout { shards },
        strays,
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

    fn at(addr: &str, id: ShardIdentity) -> Member {
        Member {
            address: addr.to_string(),
            identity: id,
            answering: true,
        }
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
    /// replicas, is left out and named; the set forms from the rest. Only a set with a shard that
    /// has no replica left, or no server at all, is refused.
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
        let want = vec![
            (id(0, 2), vec!["a2".to_string()]),
            (id(1, 2), vec!["b".to_string()]),
        ];
        assert_eq!(again.layout, SetLayout { shards: want });

        let missing = assemble(&[at("a", id(0, 2)), at("x", id(5, 9))], None).unwrap_err();
        assert!(
            matches!(missing, SetError::Missing { shard: 1, .. }),
            "{missing}"
        );
        assert!(missing.to_string().contains("left out: x"), "{missing}");
        // A server that says its set has no shards is no set at all, and no panic.
        assert!(assemble(&[at("a", id(0, 0))], None).is_err());
        assert_eq!(assemble(&[], None), Err(SetError::Empty));
    }

    /// A new build rolled out replica by replica: once the new set is complete with servers that
    /// answer, it wins over the set accepted before, which now has a shard only down replicas hold.
    #[test]
    fn a_complete_set_of_answering_servers_wins_over_the_one_accepted_before() {
        let new = |k| {
            let mut id = id(k, 2);
            id.set_id = "new".into();
            id
        };
        let accepted = assemble(&[at("a", id(0, 2)), at("b", id(1, 2))], None)
            .unwrap()
            .layout;
        let mut members = vec![
            at("a", id(0, 2)),
            at("b", id(1, 2)),
            at("c", new(0)),
            at("d", new(1)),
        ];
        members[1].answering = false;
        let formed = assemble(&members, Some(&accepted)).unwrap();
        assert_eq!(formed.layout.first().set_id, "new");
        assert_eq!(strays(&formed), vec!["a", "b"]);
        // While the old set still answers whole, it stays.
        members[1].answering = true;
        let kept = assemble(&members, Some(&accepted)).unwrap();
        assert_eq!(kept.layout.first().set_id, "s");
        // A shard whose every replica is down is still named, not forgotten.
        let down = assemble(&members[..2], Some(&accepted));
        members[1].answering = false;
        let named = assemble(&members[..2], Some(&accepted)).unwrap();
        assert_eq!(down.unwrap().layout, named.layout);
    }

    /// A replica down but known stays in its shard's list (after those answering), so live appends
    /// still go to it and fail until it is back, rather than being acknowledged without it.
    #[test]
    fn a_replica_down_stays_in_its_shard_behind_those_answering() {
        let mut members = vec![
            at("a", id(0, 2)),
            at("b", id(0, 2)),
            at("c", id(1, 2)),
            at("d", id(1, 2)),
        ];
        members[0].answering = false;
        let formed = assemble(&members, None).unwrap();
        let replicas = |f: &Assembled, k: usize| f.layout.shards[k].1.clone();
        assert_eq!(replicas(&formed, 0), vec!["b", "a"]);
        assert_eq!(replicas(&formed, 1), vec!["c", "d"]);
        assert!(formed.strays.is_empty());
        // One with other files than its shard's answering replicas is not kept.
        members[0].identity.content_id = "other".into();
        assert_eq!(replicas(&assemble(&members, None).unwrap(), 0), vec!["b"]);
    }
}
