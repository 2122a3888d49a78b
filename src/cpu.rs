//! What this CPU is, and which flavour of the model's quantized kernels runs on it.
//!
//! The flavour is chosen once, when a model is loaded: the best the CPU has, or the one that
//! `INFINI_SIDECAR_CPU` (or the server's `cpu` key) asks for, so every flavour can be tested and
//! benchmarked on a machine that has more. Asking for one the CPU lacks is an error, not a crash.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// The environment variable that picks a kernel flavour (`native`, or one of [`KernelFlavour`]'s
/// names); it wins over the server's `cpu` key.
pub const CPU_ENV: &str = "INFINI_SIDECAR_CPU";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CpuError {
    #[error(
        "unknown kernel flavour {0:?}: use native, avx512vnni, avxvnni, avx2, neondot, neon or portable"
    )]
    Unknown(String),
    #[error("this CPU ({model}) cannot run the {flavour} kernels: it lacks {missing}")]
    Unsupported {
        flavour: KernelFlavour,
        model: String,
        missing: String,
    },
}

/// The instruction sets the quantized products are written for, fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelFlavour {
    /// `vpdpbusd` on 256-bit registers, EVEX-encoded (Ice Lake and later Xeons, Zen 4 and 5).
    Avx512Vnni,
    /// `vpdpbusd`, VEX-encoded (Alder Lake, Sapphire Rapids, Zen 5).
    AvxVnni,
    /// `vpmaddubsw` + `vpmaddwd` (Haswell to Cascade Lake, Zen 1–3: most cloud x86 servers).
    Avx2,
    /// `sdot`, the dot-product extension (`asimddp`: Graviton 2 and later, Ampere Altra, Apple M1
    /// and later).
    NeonDot,
    /// NEON's widening multiplies: every aarch64 CPU.
    Neon,
    /// Plain Rust over the same repacked weights; what other CPUs run.
    Portable,
}

impl KernelFlavour {
    pub const ALL: [KernelFlavour; 6] = [
        KernelFlavour::Avx512Vnni,
        KernelFlavour::AvxVnni,
        KernelFlavour::Avx2,
        KernelFlavour::NeonDot,
        KernelFlavour::Neon,
        KernelFlavour::Portable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            KernelFlavour::Avx512Vnni => "avx512vnni",
            KernelFlavour::AvxVnni => "avxvnni",
            KernelFlavour::Avx2 => "avx2",
            KernelFlavour::NeonDot => "neondot",
            KernelFlavour::Neon => "neon",
            KernelFlavour::Portable => "portable",
        }
    }

    /// The CPU features the flavour needs (as `/proc/cpuinfo` names them).
    fn needs(self) -> &'static [&'static str] {
        match self {
            KernelFlavour::Avx512Vnni => &["avx2", "fma", "f16c", "avx512vl", "avx512_vnni"],
            KernelFlavour::AvxVnni => &["avx2", "fma", "f16c", "avx_vnni"],
            KernelFlavour::Avx2 => &["avx2", "fma", "f16c"],
            KernelFlavour::NeonDot => &["asimd", "asimddp"],
            KernelFlavour::Neon => &["asimd"],
            KernelFlavour::Portable => &[],
        }
    }

    /// Whether this CPU can run the flavour.
    pub fn supported(self) -> bool {
        self.needs().iter().all(|f| has_feature(f))
    }

    /// The fastest flavour this CPU runs.
    pub fn native() -> Self {
        Self::ALL
            .into_iter()
            .find(|f| f.supported())
            .unwrap_or(KernelFlavour::Portable)
    }

    /// Every flavour this CPU runs, fastest first (what the tests go through).
    pub fn supported_here() -> Vec<Self> {
        Self::ALL.into_iter().filter(|f| f.supported()).collect()
    }

    /// The flavour `INFINI_SIDECAR_CPU` asks for, else `configured` (the server's `cpu` key), else
    /// the native one; an error when the request is unknown or this CPU cannot run it.
    pub fn requested(configured: Option<&str>) -> Result<Self, CpuError> {
        let from_env = std::env::var(CPU_ENV).ok().filter(|v| !v.trim().is_empty());
        match from_env.as_deref().or(configured) {
            Some(request) => request.parse::<FlavourRequest>()?.resolve(),
            None => Ok(Self::native()),
        }
    }

    /// `Ok(self)` where this CPU runs the flavour, else which features it lacks.
    pub fn check(self) -> Result<Self, CpuError> {
        let missing: Vec<&str> = self
            .needs()
            .iter()
            .copied()
            .filter(|f| !has_feature(f))
            .collect();
        if missing.is_empty() {
            Ok(self)
        } else {
            Err(CpuError::Unsupported {
                flavour: self,
                model: CpuInfo::detect().model,
                missing: missing.join(", "),
            })
        }
    }
}

impl fmt::Display for KernelFlavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A request for a flavour: `native` or a flavour's name.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FlavourRequest {
    Native,
    Exactly(KernelFlavour),
}

impl FromStr for FlavourRequest {
    type Err = CpuError;

    fn from_str(s: &str) -> Result<Self, CpuError> {
        let s = s.trim().to_ascii_lowercase();
        if s == "native" {
            return Ok(FlavourRequest::Native);
        }
        KernelFlavour::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .map(FlavourRequest::Exactly)
            .ok_or(CpuError::Unknown(s))
    }
}

impl FlavourRequest {
    pub fn resolve(self) -> Result<KernelFlavour, CpuError> {
        match self {
            FlavourRequest::Native => Ok(KernelFlavour::native()),
            FlavourRequest::Exactly(f) => f.check(),
        }
    }
}

/// The CPU a figure was measured on: its model name and the features that decide our kernels'
/// speed (what every benchmark and `Info` report).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CpuInfo {
    pub model: String,
    pub arch: &'static str,
    /// The relevant features this CPU has, in `/proc/cpuinfo`'s names.
    pub features: Vec<&'static str>,
}

/// The features worth naming beside a figure (the kernels' and llama.cpp's levels).
const RELEVANT: [&str; 11] = [
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx_vnni",
    "amx_int8",
    "asimd",
    "asimddp",
];

impl CpuInfo {
    pub fn detect() -> Self {
        Self {
            model: cpu_model_name(),
            arch: std::env::consts::ARCH,
            features: RELEVANT.into_iter().filter(|f| has_feature(f)).collect(),
        }
    }

    /// One line for logs and reports: `model (arch: features)`.
    pub fn summary(&self) -> String {
        format!(
            "{} ({}: {})",
            self.model,
            self.arch,
            self.features.join(" ")
        )
    }
}

/// The CPU's marketing name from `/proc/cpuinfo` where there is one.
fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("model name") || l.starts_with("Model"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        })
        .unwrap_or_else(|| format!("unknown {} CPU", std::env::consts::ARCH))
}

/// The `flags` of `/proc/cpuinfo`'s first processor (none elsewhere).
#[cfg(target_arch = "x86_64")]
fn cpuinfo_flags() -> impl Iterator<Item = String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let flags = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, f)| f.to_string())
        .unwrap_or_default();
    flags
        .split_whitespace()
        .map(str::to_string)
        .collect::<Vec<_>>()
        .into_iter()
}

/// Whether the running CPU has `feature` (a `/proc/cpuinfo` name), by the standard library's
/// run-time detection, which also checks that the OS saves the registers.
fn has_feature(feature: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            "avx2" => is_x86_feature_detected!("avx2"),
            "fma" => is_x86_feature_detected!("fma"),
            "f16c" => is_x86_feature_detected!("f16c"),
            "avx512f" => is_x86_feature_detected!("avx512f"),
            "avx512bw" => is_x86_feature_detected!("avx512bw"),
            "avx512vl" => is_x86_feature_detected!("avx512vl"),
            "avx512_vnni" => is_x86_feature_detected!("avx512vnni"),
            "avx_vnni" => is_x86_feature_detected!("avxvnni"),
            // Its detection is not stable in the standard library; only reported, never used.
            "amx_int8" => cpuinfo_flags().any(|f| f == "amx_int8"),
            _ => false,
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        match feature {
            "asimd" => std::arch::is_aarch64_feature_detected!("neon"),
            "asimddp" => std::arch::is_aarch64_feature_detected!("dotprod"),
            _ => false,
        }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = feature;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_unknown_ones_are_refused() {
        assert_eq!("native".parse(), Ok(FlavourRequest::Native));
        assert_eq!(
            " AVX2 ".parse(),
            Ok(FlavourRequest::Exactly(KernelFlavour::Avx2))
        );
        for f in KernelFlavour::ALL {
            assert_eq!(f.name().parse(), Ok(FlavourRequest::Exactly(f)));
        }
        assert_eq!(
            "sse2".parse::<FlavourRequest>(),
            Err(CpuError::Unknown("sse2".into()))
        );
    }

    /// The portable flavour runs everywhere; native is the first supported one; a flavour this CPU
    /// lacks is refused with the features it misses (checked against the standard library's own
    /// detection, the oracle).
    #[test]
    fn flavours_follow_the_cpu() {
        assert!(KernelFlavour::Portable.supported());
        let here = KernelFlavour::supported_here();
        assert_eq!(here.first().copied(), Some(KernelFlavour::native()));
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            assert_eq!(KernelFlavour::Avx2.supported(), avx2);
            let vnni512 = avx2
                && is_x86_feature_detected!("avx512vnni")
                && is_x86_feature_detected!("avx512vl");
            assert_eq!(KernelFlavour::Avx512Vnni.supported(), vnni512);
            assert!(!KernelFlavour::Neon.supported() && !KernelFlavour::NeonDot.supported());
        }
        #[cfg(target_arch = "aarch64")]
        {
            assert!(KernelFlavour::Neon.supported());
            let dot = std::arch::is_aarch64_feature_detected!("dotprod");
            assert_eq!(KernelFlavour::NeonDot.supported(), dot);
            assert!(!KernelFlavour::Avx2.supported());
        }
        for f in KernelFlavour::ALL {
            match f.check() {
                Ok(_) => assert!(here.contains(&f)),
                Err(CpuError::Unsupported { missing, .. }) => {
                    assert!(!here.contains(&f) && !missing.is_empty())
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(!CpuInfo::detect().model.is_empty());
    }
}
