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
# (everything the CPU has except AMX, whose ggml kernels crash where the kernel grants no tile state)
# or `avx2` (AVX2, FMA and F16C only: the level of most cloud CPUs, to set beside our AVX2 flavour).
# llamafile's sgemm is off: with it a pass of several rows computes other sums than single-row passes,
# so verifying a draft could pick another token than plain decoding would. pip's wheel cache is
# bypassed, as it would hand one level's wheel to the other. Prints the environment's Python.
LLAMA_CPP_VERSION=0.3.36
llama_cpp_venv() {
  case "$1" in
    native) echo "$CACHE/venv-llama-cpp-$LLAMA_CPP_VERSION-native-$(cpu_fingerprint)" ;;
    *) echo "$CACHE/venv-llama-cpp-$LLAMA_CPP_VERSION-$1" ;;
  esac
}
ensure_llama_cpp() {
  local level="$1" flags
  case "$level" in
    native) flags="-DGGML_NATIVE=ON" ;;
    avx2) flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF \
-DGGML_AVX_VNNI=OFF -DGGML_BMI2=OFF" ;;
    *) echo "ensure_llama_cpp: level native or avx2, not '$level'" >&2; return 2 ;;
  esac
  local venv
  venv="$(llama_cpp_venv "$level")"
  if ! "$venv/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    python3 -m venv "$venv"
    CMAKE_ARGS="$flags -DGGML_LLAMAFILE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
-DLLAVA_BUILD=OFF" "$venv/bin/python" -m pip install -q --no-cache-dir --no-binary llama-cpp-python \
      "llama-cpp-python==$LLAMA_CPP_VERSION" >&2
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
  "$SIDECAR_PYTHON" -m pip install -q --no-build-isolation --no-deps --force-reinstall "$SIDECAR_REPO/clients/python"
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
