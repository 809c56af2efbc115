# loopline-flink: Flink's image with Loopline and its Python environment, the Kafka SQL connector and Loopline's JVM
# operators in /opt/flink/lib. PyFlink's jars and scripts are the image's own Flink distribution (/opt/flink), not a
# second copy: the venv's pyflink/{bin,conf,lib,log,opt,plugins} link to it. Entry point: Flink's
# (/docker-entrypoint.sh: jobmanager | taskmanager | standalone-job, or any command, e.g. `loopline stream submit`).
ARG BASE_IMAGE=flink:2.2.1-java17
FROM ${BASE_IMAGE}
USER root

# The official image has no Python: Python 3.11 from the distribution's packages (bookworm's python3 is 3.11).
RUN command -v python3.11 >/dev/null || (apt-get update \
        && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 python3.11-venv \
        && rm -rf /var/lib/apt/lists/*)
RUN python3.11 -m venv /opt/loopline/venv && install -d -o flink -g flink /var/lib/loopline
ENV PATH=/opt/loopline/venv/bin:/opt/flink/bin:$PATH VIRTUAL_ENV=/opt/loopline/venv LOOPLINE_HOME=/var/lib/loopline \
    LOOPLINE_JARS_DIR=/opt/loopline/jars

# Dependencies before code: this layer is rebuilt only when the pinned set changes, from the wheelhouse every image
# build shares (pip-install.sh). The CA bundle reaches pip as a build secret, never a layer.
COPY requirements/core.txt /opt/loopline/requirements.txt
COPY pip-install.sh /opt/loopline/pip-install.sh
RUN --mount=type=secret,id=cabundle --mount=type=cache,id=loopline-wheels,target=/var/cache/loopline-wheels,sharing=locked \
    PIP_CERT=/run/secrets/cabundle PIP_DISABLE_PIP_VERSION_CHECK=1 \
    sh /opt/loopline/pip-install.sh /var/cache/loopline-wheels /opt/loopline/requirements.txt \
    && pyflink=$(python -c 'import pyflink, os; print(os.path.dirname(pyflink.__file__))') \
    && for part in bin conf lib log opt plugins; do rm -rf "$pyflink/$part" && ln -s "/opt/flink/$part" "$pyflink/$part"; done

# The connector and operators jars in Flink's lib/; LOOPLINE_JARS_DIR lays them out as Loopline's jar cache does, so
# the jobs find them without Maven or javac.
COPY --chown=flink:flink jars/ /opt/flink/lib/
RUN mkdir -p /opt/loopline/jars/flink /opt/loopline/jars/loopline \
    && for jar in /opt/flink/lib/flink-sql-connector-kafka-*.jar; do ln -s "$jar" /opt/loopline/jars/flink/; done \
    && for jar in /opt/flink/lib/loopline-*.jar; do ln -s "$jar" /opt/loopline/jars/loopline/; done

COPY wheel/ /tmp/wheel/
RUN pip install --no-deps --no-cache-dir --disable-pip-version-check -q /tmp/wheel/*.whl && rm -rf /tmp/wheel
# The project the jobs compile their plan from and decode its events by (the one in force where the images were built).
COPY project/ /opt/loopline/project/
ENV LOOPLINE_PROJECT=/opt/loopline/project

USER flink
