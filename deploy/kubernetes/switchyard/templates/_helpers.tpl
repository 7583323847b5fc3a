{{/* Names: every object is "<release>-switchyard-<part>" unless fullnameOverride says otherwise. */}}
{{- define "switchyard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains "switchyard" .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-switchyard" .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "switchyard.name" -}}
{{- printf "%s-%s" (include "switchyard.fullname" .root) .part -}}
{{- end -}}

{{/* Labels on every object; the selector labels are the stable subset a Deployment selects by. */}}
{{- define "switchyard.labels" -}}
app.kubernetes.io/name: switchyard
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .part }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "switchyard.selector" -}}
app.kubernetes.io/name: switchyard
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .part }}
{{- end -}}

{{/* Image references: "web" is docker/web.Dockerfile, "worker" docker/worker.Dockerfile. */}}
{{- define "switchyard.image" -}}
{{- $image := index .root.Values.images .image -}}
{{- printf "%s:%s" $image.repository ($image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/* Both images run as uid 10001 (USER in the Dockerfiles). */}}
{{- define "switchyard.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* What every Switchyard pod has: the chart's service account without an API token (no pod
     calls the Kubernetes API), the pull secrets, and uid 10001. */}}
{{- define "switchyard.podBasics" -}}
serviceAccountName: {{ include "switchyard.name" (dict "root" . "part" "pods") }}
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets: {{ toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- include "switchyard.podSecurityContext" . | nindent 2 }}
{{- end -}}

{{- define "switchyard.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{/* The control plane's settings: the ConfigMap, Redis and the database and secret key. The
     node agent gets the first two only (a GPU node never holds database credentials). */}}
{{- define "switchyard.controlPlaneEnv" -}}
envFrom:
  - configMapRef:
      name: {{ include "switchyard.name" (dict "root" . "part" "config") }}
  - secretRef:
      name: {{ include "switchyard.name" (dict "root" . "part" "redis-url") }}
  - secretRef:
      name: {{ include "switchyard.name" (dict "root" . "part" "control-plane") }}
{{- end -}}

{{/* Writable places of a read-only root file system: /tmp and the state directory. */}}
{{- define "switchyard.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: state
  mountPath: /state
{{- end -}}

{{- define "switchyard.scratchVolumes" -}}
- name: tmp
  emptyDir: {}
- name: state
  emptyDir: {}
{{- end -}}

{{- define "switchyard.modelsMount" -}}
- name: models
  mountPath: {{ .Values.models.mountPath }}
  readOnly: true
{{- end -}}

{{- define "switchyard.modelsVolume" -}}
- name: models
{{ toYaml .Values.models.volume | indent 2 }}
{{- end -}}

{{/* Web, beat and the control worker start once the database holds this release's schema: the
     migrate Job applies it, each of them waits for it (`migrate --check` fails while a
     migration is unapplied), so a new version's web never serves an old schema. */}}
{{- define "switchyard.waitForMigrations" -}}
- name: wait-for-migrations
  image: {{ include "switchyard.image" (dict "root" . "image" "web") }}
  imagePullPolicy: {{ .Values.images.web.pullPolicy }}
  command: [sh, -c, "until python manage.py migrate --check >/dev/null 2>&1; do echo 'waiting for the migrate Job'; sleep 3; done"]
  {{- include "switchyard.controlPlaneEnv" . | nindent 2 }}
  securityContext:
    {{- include "switchyard.containerSecurityContext" . | nindent 4 }}
  resources:
    {{- toYaml .Values.migrate.resources | nindent 4 }}
  volumeMounts:
    {{- include "switchyard.scratchMounts" . | nindent 4 }}
{{- end -}}

{{/* Restart pods whose settings changed (a ConfigMap or Secret change alone rolls nothing). */}}
{{- define "switchyard.configChecksum" -}}
checksum/config: {{ include (print .Template.BasePath "/config.yaml") . | sha256sum }}
checksum/secrets: {{ include (print .Template.BasePath "/secrets.yaml") . | sha256sum }}
{{- end -}}

{{/* The web Service's names, which ALLOWED_HOSTS must hold (probes and Prometheus use them). */}}
{{- define "switchyard.webHosts" -}}
{{- $web := include "switchyard.name" (dict "root" . "part" "web") -}}
{{- $hosts := list $web (printf "%s.%s.svc" $web .Release.Namespace) (printf "%s.%s.svc.cluster.local" $web .Release.Namespace) -}}
{{- if .Values.ingress.enabled -}}{{- $hosts = append $hosts .Values.ingress.host -}}{{- end -}}
{{- join "," (concat $hosts .Values.extraAllowedHosts) -}}
{{- end -}}

{{/* The agent's devices, requested and limited alike (extended resources must be equal). */}}
{{- define "switchyard.agentDevices" -}}
{{- with .Values.agent -}}
{{- if gt (int .gpusPerNode) 0 }}
nvidia.com/gpu: {{ .gpusPerNode }}
{{- end }}
{{- if .rdma.resource }}
{{ .rdma.resource }}: {{ .rdma.count }}
{{- end }}
{{- if .hugepages2Mi }}
hugepages-2Mi: {{ .hugepages2Mi }}
{{- end }}
{{- end -}}
{{- end -}}
