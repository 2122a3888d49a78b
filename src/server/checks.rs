//! Checks of a request's parts against the service's limits, made before any work.

use std::time::{Duration, Instant};

use tonic::{Request, Status};

use super::config::Limits;

/// When the caller's `grpc-timeout` runs out, if it sent one.
pub(super) fn deadline_of<T>(request: &Request<T>) -> Option<Instant> {
    let value = request.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let timeout = match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(Instant::now() + timeout)
}

/// Refuses a `max_support` above the limit (0, exact, is always allowed).
pub(super) fn check_max_support(limits: &Limits, max_support: u64) -> Result<(), Status> {
    if max_support > limits.max_support {
        return Err(Status::invalid_argument(format!(
            "max_support must be at most {}",
            limits.max_support
        )));
    }
    Ok(())
}

/// Refuses a request part longer than `max_context_tokens`.
pub(super) fn check_len(limits: &Limits, what: &str, len: usize) -> Result<(), Status> {
    if len > limits.max_context_tokens {
        return Err(Status::invalid_argument(format!(
            "{what} has {len} tokens, more than the limit of {}",
            limits.max_context_tokens
        )));
    }
    Ok(())
}

/// Bytes of text a token stands for at most on average, however the text is written: text longer
/// than the token limit times this is refused before it is tokenized (tokenizing megabytes to then
/// refuse the ids on their count would be the work the limit is there to stop).
const MAX_TEXT_BYTES_PER_TOKEN: usize = 16;

pub(super) fn check_text(limits: &Limits, what: &str, text: &str) -> Result<(), Status> {
    let most = limits
        .max_context_tokens
        .saturating_mul(MAX_TEXT_BYTES_PER_TOKEN);
    if text.len() > most {
        return Err(Status::invalid_argument(format!(
            "{what} has {} bytes of text, more than the {most} that the limit of {} tokens allows",
            text.len(),
            limits.max_context_tokens
        )));
    }
    Ok(())
}
