#!/bin/sh
# pip-install.sh WHEELHOUSE REQUIREMENTS [PACKAGE ...]: install the requirement file (every distribution pinned,
# `--no-deps`: nothing is resolved again), then the packages named, resolved within those pins, into the active venv,
# from WHEELHOUSE: the build's cache mount, which every image build of this machine shares.
#
# pip's own HTTP cache stays empty here (the proxy's responses carry no caching headers), so the wheelhouse is what
# saves the downloads: `pip wheel --find-links` takes a wheel already there before the index's copy, and fetches, or
# builds from an sdist, only what is missing (once for every image); the install reads the wheelhouse alone.
set -eu
wheelhouse=$1 requirements=$2
shift 2
pip wheel --no-deps --use-pep517 -q --find-links "$wheelhouse" -w "$wheelhouse" -r "$requirements"
pip install --no-deps --no-index -q --find-links "$wheelhouse" -r "$requirements"
if [ "$#" -gt 0 ]; then
    pip wheel --use-pep517 -q --find-links "$wheelhouse" -w "$wheelhouse" -c "$requirements" "$@"
    pip install --no-index -q --find-links "$wheelhouse" -c "$requirements" "$@"
fi
