//! Scale-out: one reference corpus split over shard servers, each a sidecar over its own shard
//! (`index build --shard K/N`), behind stateless routers that serve the whole `sidecar.v1` API.
//! Every cluster role lives here; the server only wires them into gRPC services
//! (`server::shard`, `server::router`):
//! - building a shard: which documents it takes and the set's id ([`split`]);
//! - answering as a shard: one index's part of a sharded answer, over either kind ([`partial`]);
//! - routing: the shard set a router accepts ([`set`]), the fan-out of a call to every shard and
//!   its replicas (`fan_out`), which shard each call is for ([`identity`]), what it checks of
//!   every shard answer before trusting it ([`validate`]), how it reads them ([`wire`]), their
//!   merge into one index's answer ([`merge`]), and the shards seen as the library's own faces:
//!   evidence, back-off levels, live namespaces (`remote`).
//!
//! # Why the merged answers are exact
//!
//! A shard server answers over its own suffix arrays, or the compressed index made from them (which
//! reads each suffix array's samples from its exact counts in the suffix array's order), with
//! [`crate::cluster::partial`] answers, and the router merges them into what one index holding every
//! suffix array would answer:
//! - **Counts add up**: an n-gram's occurrences are the sum of each shard's (documents never span
//!   shards, and a document end is an eos wherever the shard cuts).
//! - **∞-gram**: a suffix occurs in the corpus iff it occurs in some shard, and occurrence only
//!   shrinks as the suffix grows, so the longest suffix found in the corpus is the longest found by
//!   any shard. Shards that matched less have no occurrence of it and add nothing; the counts and
//!   distributions of the shards that matched that far add up. Each shard finds its own longest
//!   suffix, so one round trip is enough. The same holds per position for dense scoring.
//! - **Sparse**: the ∞-gram distribution has one token iff every shard that matched that far has
//!   only that token after its matches ([`crate::index::query::Spread`] merges).
//! - **Back-off levels**: a suffix's count and its next tokens' counts add up over the shards, so
//!   each level (the longest suffix, then each shorter one whose count grows) and the mixture drawn
//!   from are one index's (`remote`).
//! - **Documents**: a document lies in one shard. The router numbers shard k's documents after
//!   those of shards 0..k, so with a build split by `--shard K/N` (contiguous runs of the input)
//!   every document keeps its number in a single index over the same input. Searches take two
//!   round trips: the counts of every clause decide the strides a single index would use.
//! - **Maximal spans** (`Trace`): the longest span from a start that occurs in the corpus is the
//!   longest any shard holds, for the same reason as the ∞-gram; each shard sends its lengths
//!   (`SpanLengths`), then the spans' counts add up and their documents come from the search.
//! - **The gate's features** of a position are its ∞-gram match (merged as above), counts of its
//!   last k tokens (they add up; a shard sends those up to its own match, longer ones do not occur
//!   in it) and a subsample of what followed the match (each shard sends its suffix arrays' fine
//!   samples at its own longest match; only the shards that matched the longest count, as for the
//!   ∞-gram). **Drafts** read continuations of evenly spread matches of the sequence's longest
//!   suffix: each shard sends every suffix array's fine samples with their following tokens, the
//!   router picks the ranks one index over all the suffix arrays reads.
//!
//! Everything above is exact whatever the layout: the router's answer is the answer of any single
//! index over the same documents. **Subsampled answers** (`max_support`, a search whose clauses
//! are subsampled, the gate's support estimate, drafts) are estimates whose sample depends on where suffix arrays begin and end: the
//! router's equals that of a single index over the **same suffix arrays** (`Index::join` of the
//! shards, in order). For distributions, a single index gives each suffix array a share of the
//! samples in proportion to its matches, picked among that suffix array's fine samples
//! ([`crate::index::sampling`]), which need no total: a shard sends them, the router picks.
//!
//! Round trips per call: one per shard for count, ntd, the ∞-gram, a document's dense evidence
//! with its gate features (`ScoreTokens`), and a draft (`Continuations` with a depth); two for a
//! document search, and for a decoding step's gate features (after its ∞-gram).

pub(crate) mod fan_out;
pub mod identity;
pub mod merge;
pub mod partial;
pub(crate) mod remote;
pub mod set;
pub mod split;
pub mod validate;
pub mod wire;
