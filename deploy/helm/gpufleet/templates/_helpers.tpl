{{- define "gpufleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- define "gpufleet.slurmImage" -}}
{{ .Values.slurmImage.repository }}:{{ .Values.slurmImage.tag }}
{{- end -}}
{{- define "gpufleet.labels" -}}
app.kubernetes.io/part-of: gpufleet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "gpufleet.slurmConfig" -}}{{ .Values.slurm.clusterName }}-slurm-config{{- end -}}
{{- define "gpufleet.slurmVolumes" -}}
- name: slurm-config
  configMap:
    name: {{ include "gpufleet.slurmConfig" . }}
    defaultMode: 0755   # the gpufleet-{health,prolog,epilog} hooks are programs
- name: munge-key
  secret:
    secretName: {{ .Release.Name }}-munge-key
    defaultMode: 0400
- name: jwt-key
  secret:
    secretName: {{ .Release.Name }}-slurm-jwt
    defaultMode: 0400
- name: munge-run
  emptyDir: {}
{{- end -}}
{{- define "gpufleet.slurmMounts" -}}
- {name: slurm-config, mountPath: /etc/slurm}
- {name: jwt-key, mountPath: /etc/slurm/jwt}
- {name: munge-run, mountPath: /run/munge}
{{- end -}}
{{- define "gpufleet.munged" -}}
- name: munged
  image: {{ include "gpufleet.slurmImage" . }}
  imagePullPolicy: {{ .Values.slurmImage.pullPolicy }}
  command: [munged, --foreground, --key-file=/etc/munge-key/munge.key, --socket=/run/munge/munge.socket.2]
  volumeMounts:
    - {name: munge-key, mountPath: /etc/munge-key}
    - {name: munge-run, mountPath: /run/munge}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 64Mi}
{{- end -}}
{{- define "gpufleet.slurmTolerations" -}}
# Slurm pods stay on nodes gpufleet holds, lends or takes out: Slurm's drain
# state, not Kubernetes scheduling, keeps jobs off those nodes.
- {key: gpufleet.io/slurm, operator: Exists}
- {key: gpufleet.io/unhealthy, operator: Exists}
- {key: gpufleet.io/unverified, operator: Exists}
- {key: gpufleet.io/spare, operator: Exists}
- {key: node.kubernetes.io/unschedulable, operator: Exists, effect: NoSchedule}
{{- end -}}
{{- /* The BMC Secrets' namespace; never the release's, which holds the munge and JWT keys. */ -}}
{{- define "gpufleet.bmcNamespace" -}}
{{- if or (eq .Values.bmcSecretsNamespace .Release.Namespace) (eq .Values.bmcSecretsNamespace "kube-system") (not .Values.bmcSecretsNamespace) -}}
{{- fail (printf "bmcSecretsNamespace %q: must be a namespace of its own, not the release namespace (the Slurm keys) nor kube-system" .Values.bmcSecretsNamespace) -}}
{{- end -}}
{{ .Values.bmcSecretsNamespace }}
{{- end -}}
