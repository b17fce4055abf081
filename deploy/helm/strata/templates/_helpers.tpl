{{/* Name prefix of every object: the release name, plus "-strata" unless it already says so. */}}
{{- define "strata.fullname" -}}
{{- if contains "strata" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-strata" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "strata.labels" -}}
app.kubernetes.io/name: strata
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "cache"). */}}
{{- define "strata.selectorLabels" -}}
app.kubernetes.io/name: strata
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "strata.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{/* The port of a host:port listen address. */}}
{{- define "strata.port" -}}
{{- splitList ":" . | last -}}
{{- end -}}

{{- define "strata.secretName" -}}
{{- if .Values.secrets.create -}}
{{- printf "%s-secrets" (include "strata.fullname" .) -}}
{{- else -}}
{{- required "secrets.existingSecret is required when secrets.create is false" .Values.secrets.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* The scheduler's gRPC address workers register with. */}}
{{- define "strata.schedulerAddress" -}}
{{- if .Values.config.worker.scheduler_address -}}
{{- .Values.config.worker.scheduler_address -}}
{{- else -}}
{{- printf "%s-scheduler.%s.svc.cluster.local:%s" (include "strata.fullname" .) .Release.Namespace (include "strata.port" .Values.config.scheduler.listen) -}}
{{- end -}}
{{- end -}}

{{/* Pod-level settings shared by every Strata pod. */}}
{{- define "strata.podCommon" -}}
nodeSelector:
  {{- toYaml .Values.nodeSelector | nindent 2 }}
tolerations:
  {{- toYaml .Values.tolerations | nindent 2 }}
securityContext:
  runAsUser: {{ .Values.runAsUser }}
  runAsGroup: {{ .Values.runAsUser }}
  runAsNonRoot: true
  fsGroup: {{ .Values.runAsUser }}
{{- end -}}

{{/* A container's securityContext (seccomp is set per container where needed). */}}
{{- define "strata.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
{{- end -}}

{{/* /healthz probes on a port: (dict "port" N "startupPeriod" S "startupFailures" F). */}}
{{- define "strata.probes" -}}
readinessProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: 5
livenessProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: 10
  failureThreshold: 6
{{- if .startupPeriod }}
startupProbe:
  httpGet:
    path: /healthz
    port: {{ .port }}
  periodSeconds: {{ .startupPeriod }}
  failureThreshold: {{ .startupFailures }}
{{- end }}
{{- end -}}

{{- define "strata.configVolumes" -}}
- name: config
  configMap:
    name: {{ include "strata.fullname" . }}-config
- name: secret
  secret:
    secretName: {{ include "strata.secretName" . }}
    defaultMode: 0440
- name: tmp
  emptyDir: {}
{{- end -}}

{{- define "strata.modelsVolume" -}}
- name: models
{{- if .Values.models.existingClaim }}
  persistentVolumeClaim:
    claimName: {{ .Values.models.existingClaim }}
    readOnly: true
{{- else }}
  hostPath:
    path: {{ .Values.models.hostPath }}
    type: Directory
{{- end }}
{{- end -}}

{{- define "strata.configMounts" -}}
- name: config
  mountPath: /etc/strata/config
  readOnly: true
- name: secret
  mountPath: /etc/strata/secret
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- end -}}
