//! The integration tests, as one binary: each file is a module, so the crate and its dependencies
//! are linked once instead of once per file (fifteen links with debug info were minutes of every
//! fresh build). `cargo nextest run -E 'test(server_model::)'` runs one file's tests.

mod common;

mod backoff;
mod byte_level;
mod byte_mixing;
mod cli;
mod cluster;
mod cluster_chaos;
mod cluster_identity;
mod cluster_malformed;
mod cluster_netns;
mod cluster_restart;
mod cluster_streams;
mod compressed;
mod contamination;
mod deploy;
mod draft_real;
mod engine_vs_brute_force;
mod every_index;
mod flavours_real;
mod fuzz_replay;
mod hints;
mod layout;
mod live;
mod live_hardening;
mod live_soak;
mod mix_real;
mod model_real;
mod model_tiny;
mod open_checks;
mod python_client;
mod reference_peer;
mod server;
mod server_batch;
mod server_hardening;
mod server_load;
mod server_model;
mod spec_real;
mod trace;
mod vllm;
mod workload_real;
