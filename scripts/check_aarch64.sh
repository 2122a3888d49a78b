#!/usr/bin/env bash
# Builds the crate for aarch64 Linux (Graviton, Ampere, Apple silicon under Linux) and, with --test,
# runs the library's tests (the ARM kernel flavours and the portable one among them) under qemu-user.
#
# Rustup cannot fetch another target's standard library here, so this takes Debian's own Rust
# toolchain for that: `rustc-web` (a current rustc in Debian 12's security suite) and its standard
# library built for arm64 (`libstd-rust-web-dev:arm64`), unpacked under $CACHE/aarch64 without
# installing them, beside the cross C compiler and qemu-user, which are installed.
#
#   bash scripts/check_aarch64.sh                 # cargo check of the library and the binary
#   bash scripts/check_aarch64.sh --test FILTER   # also the library's tests matching FILTER, emulated
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
root="$CACHE/aarch64/toolchain"
apt_state="$CACHE/aarch64/apt"

# The amd64 compiler and the arm64 standard library must be the same Debian build.
if [ ! -x "$root/usr/bin/rustc" ] || [ ! -d "$root/usr/lib/rustlib/aarch64-unknown-linux-gnu" ]; then
  apt-get update -qq
  version="$(apt-cache policy rustc-web | awk '/Candidate:/ {print $2}')"
  std_so="$(apt-cache depends libstd-rust-web-dev | awk '/Depends: libstd-rust-web-1/ {print $2; exit}')"
  llvm="$(apt-cache depends "$std_so" | awk '/Depends: libllvm/ {print $2; exit}')"
  if [ -z "$version" ] || [ -z "$std_so" ] || [ -z "$llvm" ]; then
    echo "check_aarch64: Debian's rustc-web toolchain is not in this machine's package lists" >&2
    exit 1
  fi
  debs="$(mktemp -d)"
  (cd "$debs" && apt-get download -q "rustc-web=$version" "libstd-rust-web-dev=$version" "$std_so" "$llvm")
  # Another architecture's package, from a package list of our own: the system's apt setup is not
  # touched.
  mkdir -p "$apt_state/lists/partial" "$apt_state/cache/archives/partial"
  touch "$apt_state/status"
  security=""
  for list in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list /etc/apt/sources.list; do
    [ -f "$list" ] && [ -z "$security" ] || continue
    security="$(grep -v '^\s*#' "$list" | tr ' ' '\n' | grep -m1 -E '^(http|https)://.*debian-security' || true)"
  done
  if [ -z "$security" ]; then
    echo "check_aarch64: no debian-security archive in this machine's apt sources" >&2
    exit 1
  fi
  codename="$(. /etc/os-release && echo "$VERSION_CODENAME")"
  echo "deb [arch=arm64] $security $codename-security main" >"$apt_state/sources.list"
  own_apt=(-o "Dir::State::Lists=$apt_state/lists" -o "Dir::Cache=$apt_state/cache"
    -o "Dir::Etc::SourceList=$apt_state/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
    -o "Dir::State::status=$apt_state/status" -o "APT::Architecture=arm64" -o "APT::Architectures::=arm64")
  apt-get "${own_apt[@]}" update -qq
  (cd "$debs" && apt-get "${own_apt[@]}" download -q "libstd-rust-web-dev:arm64=$version")
  # Unpacked beside and moved into place, so an interrupted run leaves no half toolchain.
  rm -rf "$root" "$root.new"
  mkdir -p "$root.new"
  for deb in "$debs"/*.deb; do dpkg-deb -x "$deb" "$root.new"; done
  mv "$root.new" "$root"
  rm -rf "$debs"
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc-aarch64-linux-gnu qemu-user >/dev/null
fi

export RUSTC="$root/usr/bin/rustc"
export LD_LIBRARY_PATH="$root/usr/lib/x86_64-linux-gnu:$(echo "$root"/usr/lib/llvm-*/lib)"
export CARGO_TARGET_DIR="$CACHE/aarch64/target"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
"$RUSTC" --version
# Our crate's warnings fail the check, as clippy's do on x86 (RUSTFLAGS would rebuild every
# dependency; cargo reports only ours, since it caps the dependencies' lints).
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo check --target aarch64-unknown-linux-gnu --lib --bins 2>&1 | tee "$log"
if grep -q '`infini-sidecar` (.*) generated' "$log"; then
  echo "check_aarch64: warnings on aarch64" >&2
  exit 1
fi
case "${1:-}" in
  "") ;;
  --test)
    shift
    cargo test --target aarch64-unknown-linux-gnu --lib -- "$@"
    ;;
  *)
    echo "usage: bash scripts/check_aarch64.sh [--test [FILTER]]" >&2
    exit 2
    ;;
esac
