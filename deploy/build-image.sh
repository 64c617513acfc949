#!/usr/bin/env bash
# Builds the shardq image from deploy/Dockerfile, tagged with the Helm chart's appVersion (the
# tag the chart runs when image.tag is empty), and pushes it when asked. No image is published
# yet: build and push it to a registry of yours, then install the chart with
# image.repository=<that repository>.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
chart="$root/helm/shardq"
dockerfile="$root/deploy/Dockerfile"
prog="build-image.sh"

usage() {
  cat <<EOF
Usage: deploy/$prog [options]

Builds deploy/Dockerfile (context: the repository root) as REPOSITORY:TAG.

Options:
  --repository REPO   image repository, e.g. registry.example.com/shardq
                      (default: \$SHARDQ_IMAGE_REPOSITORY, else the chart's image.repository,
                      $(chart_repository))
  --tag TAG           image tag (default: the chart's appVersion, $(app_version)); the chart
                      runs appVersion when image.tag is empty, so keep the default unless you
                      also set image.tag
  --push              push REPOSITORY:TAG after building (log in to the registry first)
  --platform LIST     target platform(s), e.g. linux/amd64 (passed to the build tool)
  --tool TOOL         docker, podman or buildah (default: \$SHARDQ_IMAGE_TOOL, else the first
                      of them on PATH)
  --dry-run           print the commands instead of running them
  --print-tag         print REPOSITORY:TAG and exit
  -h, --help          show this help

Then: helm upgrade --install shardq helm/shardq --set image.repository=REPOSITORY ...
EOF
}

die() {
  echo "$prog: $*" >&2
  exit 1
}

usage_error() {
  echo "$prog: $*" >&2
  echo "Try 'deploy/$prog --help'." >&2
  exit 2
}

# appVersion from Chart.yaml (quoted or not).
app_version() {
  sed -n 's/^appVersion:[[:space:]]*["'\'']\{0,1\}\([^"'\'']*\)["'\'']\{0,1\}[[:space:]]*$/\1/p' \
    "$chart/Chart.yaml"
}

# image.repository from the chart's values.yaml: the first `repository:` under `image:`.
chart_repository() {
  awk '/^image:/ { inside = 1; next }
       inside && /^[^[:space:]#]/ { exit }
       inside && $1 == "repository:" { print $2; exit }' "$chart/values.yaml"
}

repository=${SHARDQ_IMAGE_REPOSITORY:-}
tag=""
push=false
platform=""
tool=${SHARDQ_IMAGE_TOOL:-}
dry_run=false
print_tag=false

while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --repository | --tag | --platform | --tool)
      [ $# -ge 2 ] && [ -n "$2" ] || usage_error "$1 needs a value"
      case "$1" in
        --repository) repository=$2 ;;
        --tag) tag=$2 ;;
        --platform) platform=$2 ;;
        --tool) tool=$2 ;;
      esac
      shift 2
      ;;
    --push) push=true; shift ;;
    --dry-run) dry_run=true; shift ;;
    --print-tag) print_tag=true; shift ;;
    *) usage_error "unknown option: $1" ;;
  esac
done

[ -n "$repository" ] || repository=$(chart_repository)
[ -n "$repository" ] || die "no --repository, and no image.repository in $chart/values.yaml"
[ -n "$tag" ] || tag=$(app_version)
[ -n "$tag" ] || die "no --tag, and no appVersion in $chart/Chart.yaml"
# Docker's reference grammar, roughly: lowercase path components, a tag of [\w.-]{1,128}.
[[ "$repository" =~ ^[a-z0-9]([a-z0-9._/:-]*[a-z0-9])?$ ]] ||
  usage_error "--repository $repository is not an image repository (lowercase, e.g. registry.example.com/shardq)"
[[ "$tag" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || usage_error "--tag $tag is not an image tag"
image="$repository:$tag"

if $print_tag; then
  echo "$image"
  exit 0
fi

if [ -z "$tool" ]; then
  for candidate in docker podman buildah; do
    if command -v "$candidate" >/dev/null 2>&1; then
      tool=$candidate
      break
    fi
  done
  [ -n "$tool" ] || die "none of docker, podman or buildah is on PATH: install one (or run this where one is)"
fi
case "$tool" in
  docker | podman) build=("$tool" build) ;;
  buildah) build=(buildah build) ;;
  *) usage_error "--tool $tool: expected docker, podman or buildah" ;;
esac

revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
build+=(
  -f "$dockerfile"
  -t "$image"
  --label "org.opencontainers.image.title=shardq"
  --label "org.opencontainers.image.version=$tag"
  --label "org.opencontainers.image.revision=$revision"
)
[ -z "$platform" ] || build+=(--platform "$platform")
build+=("$root")
push_cmd=("$tool" push "$image")

# One command a line, quoted so that it can be pasted into a shell.
show() {
  local line
  line=$(printf '%q ' "$@")
  echo "${line% }"
}

if $dry_run; then
  show "${build[@]}"
  if $push; then
    show "${push_cmd[@]}"
  fi
  exit 0
fi

command -v "$tool" >/dev/null 2>&1 || die "$tool is not on PATH"
if [ "$tool" = docker ] && ! docker info >/dev/null 2>&1; then
  die "docker cannot reach a Docker engine (\`docker info\` fails): start one, or use --tool podman or --tool buildah"
fi
pyproject_version=$(sed -n 's/^version[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$root/pyproject.toml" | head -n1)
if [ -n "$pyproject_version" ] && [ "$pyproject_version" != "$tag" ]; then
  echo "$prog: note: the package inside is shardq $pyproject_version, the tag says $tag" >&2
fi

echo "$prog: building $image with $tool" >&2
"${build[@]}"
if $push; then
  echo "$prog: pushing $image" >&2
  "${push_cmd[@]}"
fi
echo "$prog: done. Install with: helm upgrade --install shardq helm/shardq --set image.repository=$repository$([ "$tag" = "$(app_version)" ] || echo " --set image.tag=$tag")" >&2
