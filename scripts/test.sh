#!/usr/bin/env bash
# Install everything the test suite needs on a clean Debian machine, then run the whole suite.
# Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the tests start real servers from: Prometheus, etcd (for the Kubernetes control
# plane), openssl (its certificates), PostgreSQL (the job store) and Chromium with its driver (the
# web console's browser tests); one apt-get update, then install only what is missing
need=()
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
    need+=(prometheus)
fi
command -v etcd >/dev/null || need+=(etcd-server)
command -v openssl >/dev/null || need+=(openssl)
if ! command -v pg_ctl >/dev/null && ! compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null; then
    need+=(postgresql)
fi
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing Debian's ${need[*]} (the tests start real servers)..."
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    log="$(mktemp -t idlegpu-apt.XXXXXX)"
    if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install \
            -y -qq -o=Dpkg::Use-Pty=0 --no-install-recommends "${need[@]}"; } >"$log" 2>&1; then
        cat "$log" >&2
        echo "apt-get failed (above); install ${need[*]} by hand and run this again" >&2
        exit 1
    fi
    rm -f "$log"
    if [[ " ${need[*]} " == *" prometheus "* ]]; then
        echo "note: Debian's prometheus package also starts a prometheus service on :9090 where" \
             "systemd runs (the default prometheus.url of idlegpu.yaml); the tests start their" \
             "own servers on free ports and never use it"
    fi
fi

# the real Kubernetes control-plane binaries (tests/kube_control_plane.py), envtest-style
if [ -z "${KUBEBUILDER_ASSETS:-}" ]; then
    if [ -f ../shared/k8s/install.sh ]; then
        bash ../shared/k8s/install.sh .cache/k8s/bin >/dev/null
    fi
    if [ -d .cache/k8s/bin ]; then
        export KUBEBUILDER_ASSETS="$PWD/.cache/k8s/bin"
    fi
fi

# the real Kueue controller manager beside them, and its CRDs (tests/kueue_manager.py)
if [ -f ../shared/kueue/install.sh ]; then
    bash ../shared/kueue/install.sh "${KUBEBUILDER_ASSETS:-$PWD/.cache/k8s/bin}" >/dev/null
    mkdir -p .cache/kueue && rm -rf .cache/kueue/crds && cp -r ../shared/kueue/crds .cache/kueue/
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and exactly: 2.13.0 is the CPU build in /opt/wheels (PIP_FIND_LINKS); a plain
# `torch` or a range would bring PyPI's CUDA build, several GB. The workload-test extra (the
# checkpoint-notice callbacks' Lightning and Transformers) must then leave it as it is
.venv/bin/python -m pip install --quiet 'torch==2.13.0'
# strict: the editable install as a tree of links to the folders, which type checkers and
# editors follow (the default, an import hook, hides the package from them: tests/test_types.py)
.venv/bin/python -m pip install --quiet -e '.[test,workload-test]' \
    --config-settings editable_mode=strict
torch_now="$(.venv/bin/python -c 'from importlib.metadata import version; print(version("torch"))')"
if [ "${torch_now%%+*}" != 2.13.0 ]; then
    echo "pip replaced torch 2.13.0 with $torch_now; bound what pulled it in (workload-test in" \
         "pyproject.toml)" >&2
    exit 1
fi

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
# every test, the slow ones too (a plain `pytest` leaves those out), on three workers for two
# cores: on two workers the cores sat idle a third of the time while tests waited on their real
# servers (docs/development.md has the timings); work stealing, because a few tests take a minute or
# two and would otherwise end the run alone. Later arguments win (`-n 0`: one process,
# `-m 'not slow'`: the quick ones)
exec .venv/bin/python -m pytest -n 3 --dist worksteal -m "slow or not slow" "$@"
