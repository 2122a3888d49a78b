//! Memory read or written at random: a compressed index's ranks, and a build's text and suffix
//! sorter. A rank over a gigabyte index, or a suffix sorter's bucket, lands on a new 4 KiB page
//! nearly every time, and each miss of the TLB costs a walk of the page tables (two-dimensional
//! under a hypervisor), so on Linux such memory is advised to be backed by 2 MiB pages. Advice
//! changes how memory is backed, never what it holds: where the kernel declines, nothing else
//! changes.

/// An empty vector with room for `capacity` items, its memory advised for huge pages.
pub(crate) fn for_random_reads<T>(capacity: usize) -> Vec<T> {
    let v: Vec<T> = Vec::with_capacity(capacity);
    advise_huge_pages(v.as_ptr().cast(), capacity * size_of::<T>());
    v
}

/// `n` zeros whose memory is advised for huge pages: a build's suffix sorter writes them at random.
/// A zeroed allocation this large is fresh pages that no one has touched, so the advice holds
/// from their first write.
pub(crate) fn zeroed_for_random_writes(n: usize) -> Vec<i32> {
    let v = vec![0i32; n];
    advise_huge_pages(v.as_ptr().cast(), n * size_of::<i32>());
    v
}

/// Starts reading `item` into the cache without waiting for it, so that the misses of reads
/// known together (the two ends of a range, a rank's line then its offsets) overlap.
pub(crate) fn prefetch<T>(item: &T) {
    // SAFETY: a prefetch is a hint that reads nothing the program sees and cannot fault; SSE,
    // which it needs, is part of every x86_64 CPU.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (item as *const T).cast(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = item;
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(start: *const u8, len: usize) {
    const HUGE_PAGE: usize = 2 << 20;
    // Only whole huge pages inside the allocation can be backed by one.
    let begin = (start as usize).next_multiple_of(HUGE_PAGE);
    let end = (start as usize).saturating_add(len) / HUGE_PAGE * HUGE_PAGE;
    if end > begin {
        // SAFETY: advice on whole pages of an allocation of ours, which madvise neither reads nor
        // writes; an error (a kernel without transparent huge pages) leaves the memory as it was.
        unsafe { libc::madvise(begin as *mut libc::c_void, end - begin, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_: *const u8, _: usize) {}

#[cfg(target_os = "linux")]
#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's flags for the mapping holding `address` (`VmFlags` in /proc/self/smaps).
    fn flags_at(address: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            let bounds = range.and_then(|(a, b)| {
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            });
            match bounds {
                Some((start, end)) if !line.starts_with("VmFlags") => {
                    inside = (start..end).contains(&address)
                }
                _ if inside && line.starts_with("VmFlags:") => return Some(line.to_string()),
                _ => {}
            }
        }
        None
    }

    #[test]
    fn large_vectors_are_advised_for_huge_pages_and_small_ones_left_alone() {
        let modes = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
        if modes.map_or(true, |m| m.contains("[never]")) {
            println!("skipped: this kernel has no transparent huge pages to advise");
            return;
        }
        let large: Vec<u64> = for_random_reads(2 << 20); // 16 MiB
        let middle = large.as_ptr() as usize + (8 << 20);
        let flags = flags_at(middle).expect("the vector's mapping is listed");
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
        let mut small: Vec<u64> = for_random_reads(1000);
        small.extend(0..1000);
        let flags = flags_at(small.as_ptr() as usize).expect("the vector's mapping is listed");
        assert!(!flags.split_whitespace().any(|f| f == "hg"), "{flags}");
        assert_eq!(small.iter().sum::<u64>(), 999 * 1000 / 2);
        let zeroed = zeroed_for_random_writes(4 << 20); // 16 MiB
        let flags = flags_at(zeroed.as_ptr() as usize + (8 << 20)).expect("listed");
        assert!(flags.split_whitespace().any(|f| f == "hg"), "{flags}");
        assert!(zeroed.iter().all(|&z| z == 0));
    }
}
