#![no_main]
infini_sidecar_fuzz::fuzz_harness!(shard_answers);
