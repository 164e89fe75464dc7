#!/usr/bin/env bash
# Runs podmend locally on its built-in defaults, with the opt-in Jenkins agent preset turned on,
# and development certificates; sends it a real AdmissionReview (a Jenkins agent pod pinned
# with spec.nodeName), and shows the repair.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --quiet --bin podmend
bin=target/debug/podmend
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT

"$bin" certs --dns localhost --out "$work/certs" >/dev/null
# The Jenkins preset is opt-in: it matches build pods too, whose requests the scheduler needs.
printf 'rules:\n  agent-requests:\n    presets: [pinniped-kube-cert-agent, jenkins-agent]\n' >"$work/config.yaml"
"$bin" serve --listen 127.0.0.1:8443 --metrics-listen 127.0.0.1:9090 \
  --tls-cert "$work/certs/tls.crt" --tls-key "$work/certs/tls.key" \
  --config "$work/config.yaml" --kubeconfig "$work/no-cluster" 2>"$work/serve.log" &
server=$!
for _ in $(seq 100); do
  curl -sf http://127.0.0.1:9090/readyz >/dev/null && break
  sleep 0.1
done

echo "== request: examples/review-pod-nodename-agent.json (spec.nodeName: worker-1, jenkins/label, requests 500m/256Mi)"
curl -sS --cacert "$work/certs/ca.crt" -H 'Content-Type: application/json' \
  --data-binary @examples/review-pod-nodename-agent.json \
  https://localhost:8443/mutate >"$work/response.json"

python3 - "$work/response.json" <<'PY'
import base64, json, sys
response = json.load(open(sys.argv[1]))["response"]
print("== response: allowed=%s patchType=%s" % (response["allowed"], response.get("patchType")))
for warning in response.get("warnings", []):
    print("   warning:", warning)
print("== the JSON Patch (decoded from base64):")
print(json.dumps(json.loads(base64.b64decode(response["patch"])), indent=2))
PY
echo "== log line:"
grep -m1 'admission' "$work/serve.log" || true
