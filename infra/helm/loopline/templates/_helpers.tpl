{{/* The release's name prefix of every object. */}}
{{- define "loopline.name" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object; `component` names the part. Call with (dict "root" $ "component" "scorer"). */}}
{{- define "loopline.labels" -}}
{{ include "loopline.selectorLabels" . }}
app.kubernetes.io/part-of: loopline
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The labels a Service, PDB, monitor or autoscaler selects a component's pods by. */}}
{{- define "loopline.selectorLabels" -}}
app.kubernetes.io/name: loopline
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* An image reference, registry prefix and pinned tag: (dict "root" $ "image" .Values.images.scorer). */}}
{{- define "loopline.image" -}}
{{- if or (not .image.tag) (eq .image.tag "latest") -}}
{{- fail (printf "image %s needs a pinned tag (not latest)" .image.repository) -}}
{{- end -}}
{{- printf "%s%s:%s" .root.Values.images.registry .image.repository .image.tag -}}
{{- end -}}

{{- define "loopline.secretName" -}}
{{- if .Values.secrets.create -}}{{ include "loopline.name" . }}-secrets{{- else -}}{{ required "secrets.existingSecret names the Secret when secrets.create is false" .Values.secrets.existingSecret }}{{- end -}}
{{- end -}}

{{- define "loopline.claimName" -}}
{{- .Values.shared.existingClaim | default (printf "%s-shared" (include "loopline.name" .)) -}}
{{- end -}}

{{/* The Kafka every client connects to: the Strimzi cluster's bootstrap Service, or the given brokers. */}}
{{- define "loopline.bootstrapServers" -}}
{{- if .Values.kafka.strimzi -}}
{{- list (printf "%s-kafka-kafka-bootstrap.%s.svc:9092" (include "loopline.name" .) .Release.Namespace) | toJson -}}
{{- else -}}
{{- required "kafka.bootstrapServers names the brokers when kafka.strimzi is false" .Values.kafka.bootstrapServers | toJson -}}
{{- end -}}
{{- end -}}

{{/* loopline.yaml: what the chart wires (addresses, paths, ports), with `settings` merged over it. */}}
{{- define "loopline.settings" -}}
{{- $shared := .Values.shared.mountPath -}}
{{- /* Its nodes come from the Secret (loopline.redisNodes). */ -}}
{{- $redis := dict "mode" .Values.redis.mode "ssl" .Values.redis.ssl -}}
{{- if .Values.redis.inChart.enabled -}}
{{- $redis = dict "mode" "standalone" "ssl" false -}}
{{- end -}}
{{- $wired := dict
  "home" "/tmp/loopline"
  "kafka" (dict "bootstrap_servers" (include "loopline.bootstrapServers" . | fromJsonArray)
                "replication_factor" .Values.kafka.replicationFactor "min_insync_replicas" .Values.kafka.minInsyncReplicas)
  "redis" $redis
  "feature_store" (dict "feast_registry_path" (printf "%s/feast/registry.db" $shared))
  "stream" (dict "checkpoint_dir" (printf "%s/checkpoints/features" .Values.flink.stateDir) "offline_dir" (printf "%s/offline" $shared)
                 "parallelism" .Values.flink.jobs.features.parallelism "checkpoint_interval_ms" .Values.flink.checkpointIntervalMs)
  "feedback" (dict "checkpoint_dir" (printf "%s/checkpoints/joiner" .Values.flink.stateDir) "snapshots" (printf "%s/snapshots" $shared)
                   "train_dir" (printf "%s/training" $shared) "parallelism" .Values.flink.jobs.joiner.parallelism
                   "checkpoint_interval_ms" .Values.flink.checkpointIntervalMs)
  "serving" (dict "host" "0.0.0.0" "http_port" .Values.scorer.httpPort "grpc_port" .Values.scorer.grpcPort
                  "auth_token_file" "/etc/loopline/secrets/scorer-token")
  "model_registry" (dict "tracking_uri" .Values.modelRegistry.trackingUri "artifact_location" .Values.modelRegistry.artifactLocation)
  "prometheus" (dict "host" .Values.prometheus.host "port" .Values.prometheus.port)
  "dashboard" (dict "host" "0.0.0.0" "port" .Values.dashboard.port)
  "retrain" (dict "trainjob_template" (include "loopline.trainJobTemplatePath" .))
-}}
{{- mustMergeOverwrite $wired (deepCopy .Values.settings) | toYaml -}}
{{- end -}}

{{/* The Redis the pods connect to, host:port comma-separated (the Secret's redis-nodes): redis.nodes, or the
in-chart Redis's Service. */}}
{{- define "loopline.redisNodes" -}}
{{- if .Values.redis.inChart.enabled -}}
{{- printf "%s-redis:6379" (include "loopline.name" .) -}}
{{- else -}}
{{- .Values.redis.nodes | default list | join "," -}}
{{- end -}}
{{- end -}}

{{/* The pod's security: a non-root user (the Loopline images' uid 10001, or the context's "uid": the Flink image's
flink user), the shared volume's group 10001 in every pod, no privilege, the runtime's seccomp profile. */}}
{{- define "loopline.podSecurityContext" -}}
{{- $uid := get . "uid" | default 10001 }}
runAsNonRoot: true
runAsUser: {{ $uid }}
runAsGroup: {{ $uid }}
fsGroup: 10001
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{- define "loopline.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}

{{/* The environment of every Loopline container: the settings file, and the Secret's values as settings. */}}
{{- define "loopline.env" -}}
- name: LOOPLINE_CONFIG
  value: /etc/loopline/config/loopline.yaml
- name: LOOPLINE_REDIS__NODES
  valueFrom: {secretKeyRef: {name: {{ include "loopline.secretName" . }}, key: redis-nodes, optional: true}}
- name: LOOPLINE_REDIS__PASSWORD
  valueFrom: {secretKeyRef: {name: {{ include "loopline.secretName" . }}, key: redis-password, optional: true}}
- name: LOOPLINE_KAFKA__CLIENT_CONFIG
  valueFrom: {secretKeyRef: {name: {{ include "loopline.secretName" . }}, key: kafka-client-config, optional: true}}
{{- end -}}

{{- define "loopline.volumeMounts" -}}
- {name: config, mountPath: /etc/loopline/config, readOnly: true}
- {name: secrets, mountPath: /etc/loopline/secrets, readOnly: true}
- {name: shared, mountPath: {{ .Values.shared.mountPath }}}
- {name: tmp, mountPath: /tmp}
{{- if .Values.kafka.caSecret }}
- {name: kafka-ca, mountPath: /etc/loopline/kafka-ca, readOnly: true}
{{- end }}
{{- end -}}

{{- define "loopline.volumes" -}}
- name: config
  configMap: {name: {{ include "loopline.name" . }}-settings}
- name: secrets
  secret: {secretName: {{ include "loopline.secretName" . }}}
- name: shared
  persistentVolumeClaim: {claimName: {{ include "loopline.claimName" . }}}
- name: tmp
  emptyDir: {}
{{- if .Values.kafka.caSecret }}
- name: kafka-ca
  secret: {secretName: {{ .Values.kafka.caSecret }}}
{{- end }}
{{- end -}}

{{/* Annotations that roll a pod when its settings change (the Redis it connects to among them). */}}
{{- define "loopline.podAnnotations" -}}
checksum/settings: {{ printf "%s\n%s" (include "loopline.settings" .) (include "loopline.redisNodes" .) | sha256sum }}
{{- end -}}

{{/* Where the retrain trigger reads the TrainJob a retrain starts from (its ConfigMap, mounted): retrain.trainjob_template. */}}
{{- define "loopline.trainJobTemplatePath" -}}
/etc/loopline/retrain/trainjob.yaml
{{- end -}}

{{/*
The one TrainJob definition: the chart's own (training.job, on its snapshot, priority "training") and the template the
retrain trigger creates its TrainJobs from (no snapshot: offline_training/trainjob.py sets it, the name and the canary;
priority "retrain"). Call with (dict "root" $ "name" NAME "snapshot" ID-or-"" "priority" "training"|"retrain").
*/}}
{{- define "loopline.trainJob" -}}
{{- $training := .root.Values.training -}}
apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: {{ .name }}
  labels:
    {{- include "loopline.labels" (dict "root" .root "component" "training") | nindent 4 }}
    {{- if $training.kueue.enabled }}
    kueue.x-k8s.io/queue-name: {{ $training.kueue.localQueue }}
    kueue.x-k8s.io/priority-class: loopline-{{ .priority }}
    {{- end }}
spec:
  runtimeRef: {name: {{ $training.runtime.name }}}
  trainer:
    image: {{ include "loopline.image" (dict "root" .root "image" .root.Values.images.trainer) }}
    numNodes: {{ $training.job.numNodes }}
    numProcPerNode: {{ $training.job.processesPerNode }}
    env:
      {{- with .snapshot }}
      - {name: TRAIN_SNAPSHOT, value: {{ . | quote }}}
      {{- end }}
      - {name: LOOPLINE_FEEDBACK__TRAIN_PROCESSES, value: {{ $training.job.processesPerNode | quote }}}
    resourcesPerNode: {{- include "loopline.gpuResources" (dict "resources" $training.job.resources "gpus" $training.job.gpus) | nindent 6 }}
{{- end -}}

{{/* A container's resources with "gpus" NVIDIA GPUs added to its requests and limits (none: as given), as YAML:
(dict "resources" RESOURCES "gpus" N). */}}
{{- define "loopline.gpuResources" -}}
{{- $resources := deepCopy .resources }}
{{- $gpus := int .gpus }}
{{- if $gpus }}
{{- $_ := set $resources "limits" (merge (dict "nvidia.com/gpu" $gpus) $resources.limits) }}
{{- $_ := set $resources "requests" (merge (dict "nvidia.com/gpu" $gpus) $resources.requests) }}
{{- end }}
{{- toYaml $resources }}
{{- end -}}
