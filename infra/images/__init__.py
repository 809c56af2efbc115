"""Loopline's container images: their catalog (names and tags), the Dockerfiles, a Debian base made here without a
registry, and podman configured for this machine. ``loopline/images.py`` builds them (`make images`)."""
