#!/usr/bin/env bash
# The entry point of Loopline's Flink base, after the official Flink image's conventions (what the Flink Kubernetes
# operator and `docker run flink:...` rely on):
#   jobmanager | standalone-job | taskmanager [args]  -> that Flink process in the foreground, its configuration
#       updated first: addresses to bind on 0.0.0.0, jobmanager.rpc.address from JOB_MANAGER_RPC_ADDRESS (else this
#       host's name), and every "key: value" line of FLINK_PROPERTIES;
#   anything else                                     -> run as given (the operator's `bash -c kubernetes-*.sh ...`,
#       or `loopline stream submit ...`).
set -euo pipefail

configure() {
    local options=(
        "jobmanager.rpc.address=${JOB_MANAGER_RPC_ADDRESS:-$(hostname -f)}"
        "jobmanager.bind-host=0.0.0.0" "taskmanager.bind-host=0.0.0.0" "rest.bind-address=0.0.0.0"
        "blob.server.port=6124" "query.server.port=6125"
    )
    local line
    while IFS= read -r line; do
        if [[ "$line" =~ ^[[:space:]]*([^:#[:space:]]+)[[:space:]]*:[[:space:]]*(.*)$ ]]; then
            options+=("${BASH_REMATCH[1]}=${BASH_REMATCH[2]}")
        fi
    done <<< "${FLINK_PROPERTIES:-}"
    # A configuration mounted read-only (a ConfigMap) is used as it is.
    if [[ -w "${FLINK_HOME}/conf/config.yaml" ]]; then
        local args=()
        for option in "${options[@]}"; do args+=(-D "$option"); done
        "${FLINK_HOME}/bin/config-parser-utils.sh" "${FLINK_HOME}/conf" "${FLINK_HOME}/bin" "${FLINK_HOME}/lib" "${args[@]}" >/dev/null
    fi
}

case "${1:-help}" in
    jobmanager)     shift; configure; exec "${FLINK_HOME}/bin/jobmanager.sh" start-foreground "$@" ;;
    standalone-job) shift; configure; exec "${FLINK_HOME}/bin/standalone-job.sh" start-foreground "$@" ;;
    taskmanager)    shift; configure; exec "${FLINK_HOME}/bin/taskmanager.sh" start-foreground "$@" ;;
    help)           echo "usage: (jobmanager|standalone-job|taskmanager) [args] | COMMAND [args]"; exit 0 ;;
    *)              exec "$@" ;;
esac
