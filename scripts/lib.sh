# Shared helpers for scripts/test, scripts/demo and scripts/gpu-check. Source it; it sets
# TG_ROOT (the repository root) and defines the functions below. Bash only.

TG_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
JOBS="${JOBS:-2}"

# What a build on Debian/Ubuntu needs. nlohmann-json, fmt and Google Benchmark are cheap and
# used by parts of the tree (state_dict I/O, benchmarks), so they are in the base list; clang-16
# and its sanitizer/libFuzzer runtimes build the ASan+UBSan tests and the fuzz targets.
TG_DEB_PACKAGES=(cmake g++ ninja-build ccache libeigen3-dev libgtest-dev libgmock-dev
                 libbenchmark-dev nlohmann-json3-dev libfmt-dev clang-16 libclang-rt-16-dev
                 libcli11-dev)
# What scripts/demo needs: the library and the examples, no tests, benchmarks or Python modules.
TG_DEMO_DEB_PACKAGES=(cmake g++ ninja-build ccache libeigen3-dev nlohmann-json3-dev libcli11-dev)

tg_log() { printf '\n==> %s\n' "$*" >&2; }
tg_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Runs a command as root: directly when we are root, through sudo otherwise.
tg_as_root() {
  if [[ "$(id -u)" == 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    tg_die "need root (or sudo) to run: $*"
  fi
}

# Everything scripts/test needs: the Python modules of the interop and export tests, then the
# Debian packages given (tg_ensure_deb_packages).
tg_ensure_packages() {
  tg_ensure_python_modules
  tg_ensure_python_onnx
  tg_ensure_deb_packages "$@"
}

# Installs the Debian packages that are missing, with one `apt-get update` first; does
# nothing (and touches no network) when everything is already installed.
tg_ensure_deb_packages() {
  local pkgs=("$@") missing=() p
  if ! command -v dpkg-query >/dev/null 2>&1; then
    tg_log "not a Debian system: skipping package installation (need: ${pkgs[*]})"
    return 0
  fi
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    return 0
  fi
  tg_log "installing missing packages: ${missing[*]}"
  if [[ -z "${TG_APT_UPDATED:-}" ]]; then
    tg_as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
    TG_APT_UPDATED=1
  fi
  tg_as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# Python's safetensors and numpy, for the checkpoint interop tests (tests/nn/serialize_test.cpp
# skips without them). Installs quietly with pip, only when missing; never fails the build.
tg_ensure_python_modules() {
  command -v python3 >/dev/null 2>&1 || return 0
  python3 -c 'import safetensors, numpy' >/dev/null 2>&1 && return 0
  tg_log "installing python modules: safetensors numpy"
  python3 -m pip install -q safetensors numpy >/dev/null 2>&1 ||
    python3 -m pip install -q --user safetensors numpy >/dev/null 2>&1 ||
    python3 -m pip install -q --break-system-packages safetensors numpy >/dev/null 2>&1 ||
    tg_log "pip install safetensors numpy failed: the Python interop tests will skip"
}

# ONNX's checker and ONNX Runtime, for the exporter's ONNX tests (tests/export/onnx_test.cpp
# skips without them). Same policy: quiet, only when missing, never fails the build.
tg_ensure_python_onnx() {
  command -v python3 >/dev/null 2>&1 || return 0
  python3 -c 'import onnx, onnxruntime, numpy' >/dev/null 2>&1 && return 0
  tg_log "installing python modules: onnx onnxruntime numpy"
  python3 -m pip install -q onnx onnxruntime numpy >/dev/null 2>&1 ||
    python3 -m pip install -q --user onnx onnxruntime numpy >/dev/null 2>&1 ||
    python3 -m pip install -q --break-system-packages onnx onnxruntime numpy >/dev/null 2>&1 ||
    tg_log "pip install onnx onnxruntime numpy failed: the ONNX export tests will skip"
}

# Puts nvcc on PATH when the toolkit is in /usr/local/cuda; sets TG_HAVE_NVCC to 1 or 0.
tg_setup_cuda() {
  if ! command -v nvcc >/dev/null 2>&1 && [[ -x /usr/local/cuda/bin/nvcc ]]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  if command -v nvcc >/dev/null 2>&1; then TG_HAVE_NVCC=1; else TG_HAVE_NVCC=0; fi
  [[ "$TG_HAVE_NVCC" == 1 ]] && tg_ensure_cudnn_frontend
  return 0
}

# cudnn-frontend (NVIDIA's header-only C++ API over cuDNN's graph backend): its headers from
# PyPI's nvidia-cudnn-frontend wheel, unpacked into the ignored .deps/cudnn_frontend/include
# (CMake looks there). Offline machines (the GPU machine) get the folder through the device
# tool's carry. Never fails the build: without the headers, CUDA convolution and cuDNN
# attention raise tg::Error and everything else works.
TG_CUDNN_FRONTEND_VERSION=1.32.0
tg_ensure_cudnn_frontend() {
  local dest="$TG_ROOT/.deps/cudnn_frontend" tmp
  [[ -f "$dest/include/cudnn_frontend.h" ]] && return 0
  command -v python3 >/dev/null 2>&1 || return 0
  tg_log "fetching cudnn-frontend $TG_CUDNN_FRONTEND_VERSION headers into .deps/cudnn_frontend"
  tmp="$(mktemp -d)"
  rm -rf "$dest"
  if python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
       --platform manylinux_2_28_x86_64 -d "$tmp" "nvidia-cudnn-frontend==$TG_CUDNN_FRONTEND_VERSION" >/dev/null 2>&1 &&
     python3 - "$tmp" "$dest" <<'PY'
import glob, os, sys, zipfile
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith("include/") and not name.endswith("/"):
            z.extract(name, sys.argv[2] + ".part")
os.replace(sys.argv[2] + ".part", sys.argv[2])
PY
  then :; else
    tg_log "could not fetch cudnn-frontend: CUDA convolution and cuDNN attention will raise tg::Error"
  fi
  rm -rf "$tmp" "$dest.part"
}

# Sets TG_LAUNCHER_ARGS (compiler launchers for cmake) when ccache exists. The cache lives
# in $CCACHE_DIR if set, else ~/.cache/ccache, else the repository's .cache/ccache.
tg_setup_ccache() {
  TG_LAUNCHER_ARGS=()
  command -v ccache >/dev/null 2>&1 || return 0
  if [[ -z "${CCACHE_DIR:-}" ]]; then
    if mkdir -p "${HOME:-/nonexistent}/.cache/ccache" 2>/dev/null && [[ -w "$HOME/.cache/ccache" ]]; then
      export CCACHE_DIR="$HOME/.cache/ccache"
    else
      export CCACHE_DIR="$TG_ROOT/.cache/ccache"
      mkdir -p "$CCACHE_DIR"
    fi
  fi
  TG_LAUNCHER_ARGS=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
}

# The cmake arguments every build shares: Ninja, the launchers, CUDA on when nvcc exists.
# Call tg_setup_cuda and tg_setup_ccache first. Result in TG_CMAKE_ARGS.
tg_common_cmake_args() {
  TG_CMAKE_ARGS=(-G Ninja "${TG_LAUNCHER_ARGS[@]}")
  if [[ "${TG_HAVE_NVCC}" == 1 ]]; then
    TG_CMAKE_ARGS+=(-DTG_CUDA=ON "-DCMAKE_CUDA_COMPILER=$(command -v nvcc)"
                    "-DCMAKE_CUDA_ARCHITECTURES=${TG_CUDA_ARCHS:-90}")
  else
    TG_CMAKE_ARGS+=(-DTG_CUDA=OFF)
  fi
}

# Prints how long a step took: tg_timed <label> <command...>
tg_timed() {
  local label="$1" start rc=0
  shift
  start=$(date +%s)
  "$@" || rc=$?
  printf -- '--- %s: %s (%ss)\n' "$label" "$([[ $rc == 0 ]] && echo ok || echo "FAILED rc=$rc")" \
    "$(($(date +%s) - start))" >&2
  return "$rc"
}
