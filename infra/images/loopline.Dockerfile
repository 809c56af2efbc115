# Loopline's Python images, one stage each over one venv: the scorer (`--target scorer`, CPU or CUDA by its
# requirements), the trainer (`--target trainer`) and the monitor + dashboard (`--target ops`). Non-root (uid 10001);
# the entry point is the `loopline` command.
#   REQUIREMENTS   requirements/<this>.txt: every distribution pinned (`--no-deps`: nothing is resolved again), installed
#                  by pip-install.sh from the wheelhouse every image build shares (a cache mount)
#   EXTRA          packages installed on top, resolved within those pins (the CUDA scorer's onnxruntime-gpu: its
#                  requirements leave out the CPU onnxruntime, which writes the same `onnxruntime` package)
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE} AS app
RUN groupadd --gid 10001 loopline && useradd --uid 10001 --gid loopline --create-home --home-dir /home/loopline loopline \
    && python3 -m venv /opt/loopline/venv && install -d -o loopline -g loopline /var/lib/loopline
ENV PATH=/opt/loopline/venv/bin:$PATH VIRTUAL_ENV=/opt/loopline/venv LOOPLINE_HOME=/var/lib/loopline

ARG REQUIREMENTS=core
ARG EXTRA=""
COPY requirements/${REQUIREMENTS}.txt /opt/loopline/requirements.txt
COPY pip-install.sh /opt/loopline/pip-install.sh
RUN --mount=type=secret,id=cabundle --mount=type=cache,id=loopline-wheels,target=/var/cache/loopline-wheels,sharing=locked \
    PIP_CERT=/run/secrets/cabundle PIP_DISABLE_PIP_VERSION_CHECK=1 \
    sh /opt/loopline/pip-install.sh /var/cache/loopline-wheels /opt/loopline/requirements.txt $EXTRA

COPY wheel/ /tmp/wheel/
RUN pip install --no-deps --no-cache-dir --disable-pip-version-check -q /tmp/wheel/*.whl && rm -rf /tmp/wheel
# The project every command acts on (the one in force where the images were built), read only.
COPY project/ /opt/loopline/project/
ENV LOOPLINE_PROJECT=/opt/loopline/project
USER loopline
WORKDIR /home/loopline
ENTRYPOINT ["loopline"]

FROM app AS scorer
# The doors listen on every address of the container; the CUDA variant's libraries are pip's (nvidia/cu13, cudnn).
ENV LOOPLINE_SERVING__HOST=0.0.0.0 \
    LD_LIBRARY_PATH=/opt/loopline/venv/lib/python3.11/site-packages/nvidia/cu13/lib:/opt/loopline/venv/lib/python3.11/site-packages/nvidia/cudnn/lib
EXPOSE 8080 50051
CMD ["serve", "--http", "--grpc"]

FROM app AS ops
ENV LOOPLINE_DASHBOARD__HOST=0.0.0.0
CMD ["monitor"]

FROM app AS trainer
CMD ["train", "--help"]
