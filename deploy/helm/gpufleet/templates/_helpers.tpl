{{- define "gpufleet.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- define "gpufleet.slurmImage" -}}
{{ .Values.slurmImage.repository }}:{{ .Values.slurmImage.tag }}
{{- end -}}
{{- /* Chart name, or nameOverride. */ -}}
{{- define "gpufleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- /* Every object's name prefix: fullnameOverride, else the release name (when it
     already holds the chart name) or "<release>-<name>". Two releases never share one. */ -}}
{{- define "gpufleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 35 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "gpufleet.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 35 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 35 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- /* A component's object name: "<fullname>-<component>". */ -}}
{{- define "gpufleet.component" -}}
{{- printf "%s-%s" (include "gpufleet.fullname" .root) .name -}}
{{- end -}}
{{- /* Selector labels of a component (dict "root" $ "name" "controller"). */ -}}
{{- define "gpufleet.selector" -}}
app.kubernetes.io/name: {{ include "gpufleet.name" .root }}-{{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}
{{- define "gpufleet.labels" -}}
app.kubernetes.io/part-of: gpufleet
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- /* The SlurmCluster's name (and Slurm's ClusterName): slurm.clusterName, else the fullname. */ -}}
{{- define "gpufleet.slurmCluster" -}}{{ .Values.slurm.clusterName | default (include "gpufleet.fullname" .) }}{{- end -}}
{{- /* The operator writes the SlurmCluster's config to "<name>-slurm-config". */ -}}
{{- define "gpufleet.slurmConfig" -}}{{ include "gpufleet.slurmCluster" . }}-slurm-config{{- end -}}
{{- /* Secrets holding the munge key (munge.key) and the Slurm JWT key (jwt_hs256.key):
     an existing one (secretRef) or the one the chart creates. */ -}}
{{- define "gpufleet.mungeSecret" -}}{{ .Values.slurm.munge.secretRef | default (printf "%s-munge-key" (include "gpufleet.fullname" .)) }}{{- end -}}
{{- define "gpufleet.jwtSecret" -}}{{ .Values.slurm.jwt.secretRef | default (printf "%s-slurm-jwt" (include "gpufleet.fullname" .)) }}{{- end -}}
{{- /* ServiceAccount names of the gpufleet processes. */ -}}
{{- define "gpufleet.sa.controller" -}}{{ include "gpufleet.fullname" . }}-controller{{- end -}}
{{- define "gpufleet.sa.agent" -}}{{ include "gpufleet.fullname" . }}-agent{{- end -}}
{{- define "gpufleet.sa.syncer" -}}{{ include "gpufleet.fullname" . }}-slurm-syncer{{- end -}}
{{- define "gpufleet.sa.provisioning" -}}{{ include "gpufleet.fullname" . }}-provisioning{{- end -}}
{{- /* Where a pod may run, from a component's values (dict "root" $ "c" .Values.x):
     imagePullSecrets, nodeSelector, affinity, tolerations, priorityClassName. */ -}}
{{- define "gpufleet.podPlacement" -}}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .c.nodeSelector }}
nodeSelector: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .c.affinity }}
affinity: {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .c.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}
{{- define "gpufleet.slurmConfHash" -}}
set -- $(cat "${CONF_DIR:-/etc/slurm}"/*.conf | sha256sum); echo "$1"
{{- end -}}
{{- define "gpufleet.slurmVolumes" -}}
- name: slurm-config
  configMap:
    name: {{ include "gpufleet.slurmConfig" . }}
    defaultMode: 0755   # the gpufleet-{health,prolog,epilog} hooks are programs
- name: munge-key
  secret:
    secretName: {{ include "gpufleet.mungeSecret" . }}
    defaultMode: 0400
- name: jwt-key
  secret:
    secretName: {{ include "gpufleet.jwtSecret" . }}
    defaultMode: 0400
- name: munge-run
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- end -}}
{{- define "gpufleet.slurmMounts" -}}
- {name: slurm-config, mountPath: /etc/slurm}
- {name: jwt-key, mountPath: /etc/slurm/jwt}
- {name: munge-run, mountPath: /run/munge}
{{- end -}}
{{- define "gpufleet.munged" -}}
# A native sidecar (an init container that keeps running): the Slurm daemon starts only
# once munged's socket exists (its startup probe), else it fails to create credentials.
- name: munged
  restartPolicy: Always
  image: {{ include "gpufleet.slurmImage" . }}
  imagePullPolicy: {{ .Values.slurmImage.pullPolicy }}
  terminationMessagePolicy: FallbackToLogsOnError
  # Everything it writes lives in /run/munge, so its root filesystem can be read-only.
  # munged refuses a group- or world-writable socket directory (an emptyDir is 0777) and a
  # key that is a symbolic link or readable by others (a Secret volume's file is both): it
  # gets a 0755 directory and a 0400 copy of the key there.
  command: [sh, -c, 'chmod 0755 /run/munge && install -m 0400 /etc/munge-key/munge.key /run/munge/munge.key && exec munged --foreground --key-file=/run/munge/munge.key --socket=/run/munge/munge.socket.2 --pid-file=/run/munge/munged.pid --seed-file=/run/munge/munged.seed']
  volumeMounts:
    - {name: munge-key, mountPath: /etc/munge-key}
    - {name: munge-run, mountPath: /run/munge}
  securityContext: {{- toYaml .Values.slurm.munge.securityContext | nindent 4 }}
  # munged answers on its socket once the key is loaded.
  # Exec probes start a process in the container: on a loaded node that takes seconds, and
  # every Slurm pod has this sidecar: once started, the socket is checked seldom.
  startupProbe:
    exec: {command: [test, -S, /run/munge/munge.socket.2]}
    periodSeconds: 1
    timeoutSeconds: 10
    failureThreshold: 300
  readinessProbe:
    exec: {command: [test, -S, /run/munge/munge.socket.2]}
    periodSeconds: 30
    timeoutSeconds: 10
  livenessProbe:
    exec: {command: [test, -S, /run/munge/munge.socket.2]}
    periodSeconds: 60
    timeoutSeconds: 10
  resources: {{- toYaml .Values.slurm.munge.resources | nindent 4 }}
{{- end -}}
{{- /* The accounts of slurm.users, for pods where jobs run or users log in: an init
     container appends them to copies of the image's passwd and group, which the
     containers mount over /etc/passwd and /etc/group (slurmAccountMounts). */ -}}
{{- define "gpufleet.slurmAccounts" -}}
- name: accounts
  image: {{ include "gpufleet.slurmImage" . }}
  imagePullPolicy: {{ .Values.slurmImage.pullPolicy }}
  terminationMessagePolicy: FallbackToLogsOnError
  command:
    - sh
    - -c
    - |
      cp /etc/passwd /etc/group /accounts/
      while read -r name uid gid; do
        [ -n "$name" ] || continue
        echo "$name:x:$uid:$gid::/home/$name:/bin/bash" >>/accounts/passwd
        grep -q "^$name:" /accounts/group || echo "$name:x:$gid:" >>/accounts/group
      done </etc/slurm-users/accounts
  securityContext:
    runAsUser: 65534
    runAsGroup: 65534
    runAsNonRoot: true
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities: {drop: [ALL]}
  resources:
    requests: {cpu: 10m, memory: 16Mi}
    limits: {memory: 32Mi}
  volumeMounts:
    - {name: accounts, mountPath: /accounts}
    - {name: slurm-users, mountPath: /etc/slurm-users}
{{- end -}}
{{- define "gpufleet.slurmAccountMounts" -}}
- {name: accounts, mountPath: /etc/passwd, subPath: passwd, readOnly: true}
- {name: accounts, mountPath: /etc/group, subPath: group, readOnly: true}
- {name: slurm-users, mountPath: /etc/slurm-users}
{{- end -}}
{{- define "gpufleet.slurmAccountVolumes" -}}
{{- include "gpufleet.slurmAccountVolumesOf" (dict "configMap" (printf "%s-slurm-users" (include "gpufleet.fullname" .))) }}
{{- end -}}
{{- /* The accounts volumes from one users ConfigMap: the release's (every user, for
     slurmctld and slurmd) or one tenant's (its login pod: its users only). */ -}}
{{- define "gpufleet.slurmAccountVolumesOf" -}}
- name: accounts
  emptyDir: {sizeLimit: 16Mi}
- name: slurm-users
  configMap:
    name: {{ .configMap }}
{{- end -}}
{{- define "gpufleet.slurmTolerations" -}}
# Slurm pods stay on nodes gpufleet holds, lends or takes out: Slurm's drain
# state, not Kubernetes scheduling, keeps jobs off those nodes.
- {key: gpufleet.io/slurm, operator: Exists}
- {key: gpufleet.io/unhealthy, operator: Exists}
- {key: gpufleet.io/unverified, operator: Exists}
- {key: gpufleet.io/spare, operator: Exists}
# A tenant's own nodes (decision 0290): its Slurm reservation, not the taint, keeps
# other accounts' jobs off them; slurmd must still run there.
- {key: gpufleet.io/tenant, operator: Exists}
- {key: node.kubernetes.io/unschedulable, operator: Exists, effect: NoSchedule}
{{- end -}}
{{- /* The BMC Secrets' namespace; never the release's, which holds the munge and JWT keys. */ -}}
{{- define "gpufleet.bmcNamespace" -}}
{{- if or (eq .Values.bmcSecretsNamespace .Release.Namespace) (eq .Values.bmcSecretsNamespace "kube-system") (not .Values.bmcSecretsNamespace) -}}
{{- fail (printf "bmcSecretsNamespace %q: must be a namespace of its own, not the release namespace (the Slurm keys) nor kube-system" .Values.bmcSecretsNamespace) -}}
{{- end -}}
{{ .Values.bmcSecretsNamespace }}
{{- end -}}
{{- /* Prometheus annotation-based discovery of a /metrics port (the argument). */ -}}
{{- define "gpufleet.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ . | quote }}
prometheus.io/path: /metrics
{{- end -}}
{{- /* Names of the BMC credential Secrets the chart knows: those it creates
     (bmcCredentials.create) and those listed (bmcCredentials.secretNames). */ -}}
{{- define "gpufleet.bmcSecretNames" -}}
{{- $names := list -}}
{{- range .Values.bmcCredentials.create }}{{ $names = append $names .name }}{{ end -}}
{{- range .Values.bmcCredentials.secretNames }}{{ $names = append $names . }}{{ end -}}
{{- toJson ($names | uniq) -}}
{{- end -}}
{{- /* Read access to BMC Secrets: only the named ones when any are named; else every
     Secret of bmcSecretsNamespace, which holds BMC credentials and nothing else. */ -}}
{{- define "gpufleet.bmcSecretRules" -}}
{{- $names := include "gpufleet.bmcSecretNames" . | fromJsonArray -}}
{{- if $names }}
- {apiGroups: [""], resources: [secrets], verbs: [get], resourceNames: {{ toJson $names }}}
{{- else }}
- {apiGroups: [""], resources: [secrets], verbs: [get]}
{{- end }}
{{- end -}}
{{- /* controller.managedNodes as the controller's --node-selector (key=value,...). */ -}}
{{- define "gpufleet.managedNodes" -}}
{{- include "gpufleet.pairs" .Values.controller.managedNodes -}}
{{- end -}}
{{- /* A map as key=value,... (sorted by key). */ -}}
{{- define "gpufleet.pairs" -}}
{{- $pairs := list -}}
{{- range $k, $v := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
