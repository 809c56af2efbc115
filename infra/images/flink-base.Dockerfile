# A stand-in for the official flink:<version>-java17 image, for machines that reach no registry: Java 17 from Debian
# (openjdk-17-jre-headless) and Flink's distribution (the one PyFlink's wheel carries: bin/, conf/, lib/, opt/,
# plugins/; log/ empty) at /opt/flink, owned by the user flink (9999), with the official image's entry point conventions
# (docker-entrypoint.sh). Elsewhere, loopline-flink builds FROM the official image itself.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 9999 flink && useradd --system --uid 9999 --gid flink --home-dir /opt/flink flink

ENV FLINK_HOME=/opt/flink JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64
ENV PATH=/opt/flink/bin:$PATH
COPY --chown=flink:flink flink-dist/ /opt/flink/
RUN install -d -o flink -g flink /opt/flink/log
COPY docker-entrypoint.sh /docker-entrypoint.sh

WORKDIR /opt/flink
USER flink
EXPOSE 6123 8081
ENTRYPOINT ["/docker-entrypoint.sh"]
CMD ["help"]
