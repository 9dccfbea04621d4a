{{/* ---------------------------------------------------------------- MCP servers */}}

{{/*
The environment a tool-worker pool gets for the MCP server it serves (`pool.mcp`), read by
agentstream.mcp_tools.server: AGENTSTREAM_MCP_<NAME>_COMMAND (JSON array) or _URL; the server
process's variables (`mcp.env`, Kubernetes env entries, so values may come from Secrets) with
_INHERIT_ENV naming them; each header (`mcp.headers`) from its Secret as _HEADER_<HEADER>.
No value of a header or a Secret is ever written here, only references. Context: a pool.
Output: a YAML list (possibly empty).
*/}}
{{- define "agentstream.mcpEnv" -}}
{{- $m := .mcp }}
{{- if $m }}
{{- $prefix := printf "AGENTSTREAM_MCP_%s_" (regexReplaceAll "[^A-Za-z0-9]" $m.server "_" | upper) }}
{{- if $m.command }}
- name: {{ printf "%sCOMMAND" $prefix }}
  value: {{ toJson $m.command | quote }}
{{- end }}
{{- if $m.url }}
- name: {{ printf "%sURL" $prefix }}
  value: {{ $m.url | quote }}
{{- end }}
{{- with $m.env }}
{{ toYaml . }}
- name: {{ printf "%sINHERIT_ENV" $prefix }}
  value: {{ include "agentstream.mcpEnvNames" . | quote }}
{{- end }}
{{- range $h := $m.headers }}
- name: {{ printf "%sHEADER_%s" $prefix (regexReplaceAll "[^A-Za-z0-9]" $h.name "_" | upper) }}
  valueFrom:
    secretKeyRef:
      name: {{ $h.secretName }}
      key: {{ $h.secretKey }}
{{- end }}
{{- else -}}
[]
{{- end }}
{{- end }}

{{/* The names of a list of env entries, comma-separated. */}}
{{- define "agentstream.mcpEnvNames" -}}
{{- $names := list }}
{{- range $e := . }}{{- $names = append $names $e.name }}{{- end }}
{{- join "," $names }}
{{- end }}
