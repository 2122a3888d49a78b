//! Per-call identity: every call a router makes to a shard server says which shard it takes that
//! server for (the set id, the shard's number and the content id of its files), and the server
//! refuses a call meant for another shard. Between two refreshes an address can change hands (a
//! restarted pod's IP given to a pod of another shard, a replica redeployed with other files); the
//! refusal turns what would be a wrong answer into a failover to the shard's next replica.
//!
//! The expectation travels as gRPC metadata, so every request of `sidecar.shard.v1` carries it
//! without a field of its own; a call without it (an older router, a person with grpcurl) is
//! answered as before.

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::{Request, Status};

use super::partial::PartialAnswers;
use super::set::ShardIdentity;

const SET_ID: &str = "sidecar-set-id";
const SHARD: &str = "sidecar-shard";
const CONTENT_ID: &str = "sidecar-content-id";
/// Marks a refusal as "not this shard", for the router to fail over on.
const WRONG_SHARD: &str = "sidecar-wrong-shard";

/// Which shard a call is for: what the router accepted at the address it calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub set_id: String,
    pub shard: u32,
    pub content_id: String,
}

impl From<&ShardIdentity> for Expected {
    fn from(id: &ShardIdentity) -> Self {
        Self {
            set_id: id.set_id.clone(),
            shard: id.shard,
            content_id: id.content_id.clone(),
        }
    }
}

impl Expected {
    /// Which shard `index` is, as routers name it: computed once, when a server opens it.
    pub fn of_index(index: &(impl PartialAnswers + ?Sized)) -> Self {
        let set = index.shard_set();
        Self {
            set_id: set.as_ref().map(|r| r.set_id.clone()).unwrap_or_default(),
            shard: set.as_ref().map_or(0, |r| r.shard),
            content_id: index.content_id(),
        }
    }

    /// Puts the expectation on `request` (values that are not ASCII header text are left off:
    /// set and content ids are hex, so that never happens to ours).
    pub fn stamp<T>(&self, request: &mut Request<T>) {
        let metadata = request.metadata_mut();
        for (key, value) in [
            (SET_ID, self.set_id.clone()),
            (SHARD, self.shard.to_string()),
            (CONTENT_ID, self.content_id.clone()),
        ] {
            if let Ok(value) = MetadataValue::try_from(value) {
                metadata.insert(key, value);
            }
        }
    }

    /// What a call's metadata expects, if it says.
    fn of(metadata: &MetadataMap) -> Option<Self> {
        let text = |key| metadata.get(key)?.to_str().ok().map(str::to_string);
        Some(Self {
            set_id: text(SET_ID)?,
            shard: text(SHARD)?.parse().ok()?,
            content_id: text(CONTENT_ID)?,
        })
    }
}

/// Refuses a call whose metadata expects another shard than `own` (FAILED_PRECONDITION, marked
/// for the router); a call that expects nothing passes (and `own` is not asked).
pub fn check(
    metadata: &MetadataMap,
    own: impl FnOnce() -> Result<Expected, Status>,
) -> Result<(), Status> {
    let Some(expected) = Expected::of(metadata) else {
        return Ok(());
    };
    let own = own()?;
    match expected == own {
        true => Ok(()),
        false => {
            let mut status = Status::failed_precondition(format!(
                "this server is shard {} of set {:?} with files {:?}, not the shard {} of set {:?} \
                 with files {:?} the call was meant for",
                own.shard,
                own.set_id,
                own.content_id,
                expected.shard,
                expected.set_id,
                expected.content_id
            ));
            status
                .metadata_mut()
                .insert(WRONG_SHARD, MetadataValue::from_static("1"));
            Err(status)
        }
    }
}

/// Whether a replica refused a call as meant for another shard.
pub fn is_wrong_shard(status: &Status) -> bool {
    status.metadata().contains_key(WRONG_SHARD)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expected(shard: u32, content: &str) -> Expected {
        Expected {
            set_id: "s".into(),
            shard,
            content_id: content.into(),
        }
    }

    #[test]
    fn a_call_for_another_shard_is_refused_and_marked() {
        let own = expected(1, "c1");
        let mut request = Request::new(());
        let mine = || Ok(own.clone());
        assert!(
            check(request.metadata(), || unreachable!()).is_ok(),
            "no expectation"
        );
        own.stamp(&mut request);
        assert!(check(request.metadata(), mine).is_ok());
        for other in [
            expected(0, "c1"),
            expected(1, "c2"),
            Expected {
                set_id: "t".into(),
                ..own.clone()
            },
        ] {
            let mut request = Request::new(());
            other.stamp(&mut request);
            let refused = check(request.metadata(), mine).unwrap_err();
            assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
            assert!(is_wrong_shard(&refused));
        }
        assert!(!is_wrong_shard(&Status::failed_precondition(
            "a caller's error"
        )));
    }
}
