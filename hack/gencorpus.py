# Authoring helper for the validation corpus: writes testdata/routes/{valid,invalid}.
# The YAML files are the committed source of truth; rerun after adding a case.
import copy, yaml, os, sys
root = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'testdata', 'routes')
def llm():
    return {
      'apiVersion': 'routing.modelsphere.dev/v1alpha1', 'kind': 'ModelRoute',
      'metadata': {'name': 'qwen', 'namespace': 'llm-route'},
      'spec': {
        'discovery': {'service': 'llm/qwen'},
        'cart': {'service': 'llm-route/qwen-cart', 'outputConfigMap': 'llm-route/qwen-cart-config'},
        'nginx': {'outputConfigMap': 'llm-route/openresty-conf',
                  'peers': [{'use': 'cart', 'priority': 3, 'maxConcurrencyFromBackend': True},
                            {'use': 'backend', 'priority': 2, 'maxConcurrency': 100},
                            {'use': 'backend-svc', 'priority': 1}]},
        'monitor': {'outputConfigMap': 'monitoring/monitor-conf'},
      }}
def video():
    return {
      'apiVersion': 'routing.modelsphere.dev/v1alpha1', 'kind': 'ModelRoute',
      'metadata': {'name': 'wan-video', 'namespace': 'llm-route'},
      'spec': {'modelType': 'video', 'discovery': {'service': 'video/wan'},
        'nginx': {'outputConfigMap': 'llm-route/openresty-conf',
                  'values': {'rate_limit': '200Mbps'},
                  'peers': [{'use': 'backend', 'priority': 2}, {'use': 'backend-svc', 'priority': 1}]}}}
def minimal():
    return {
      'apiVersion': 'routing.modelsphere.dev/v1alpha1', 'kind': 'ModelRoute',
      'metadata': {'name': 'tiny'},
      'spec': {'discovery': {'selector': 'app=tiny'},
        'nginx': {'outputConfigMap': 'openresty-conf', 'peers': [{'use': 'backend'}]}}}

def setp(d, path, val):
    keys = path.split('.')
    for k in keys[:-1]:
        if k.isdigit(): d = d[int(k)]
        else: d = d.setdefault(k, {})
    k = keys[-1]
    if val is DEL:
        if k.isdigit(): del d[int(k)]
        else: d.pop(k, None)
    elif k.isdigit(): d[int(k)] = val
    else: d[k] = val
DEL = object()

# (file, base, {path: value}, want, rule)
cases = [
 # rule 1: exactly one of service/selector
 ('discovery-both', llm, {'spec.discovery.selector': 'app=qwen'}, 'spec.discovery: set only one of service or selector', 'R1'),
 ('discovery-neither', llm, {'spec.discovery.service': DEL}, 'spec.discovery: set exactly one of service', 'R1'),
 ('discovery-neither-port-only', minimal, {'spec.discovery': {'port': 8000}}, 'spec.discovery: set exactly one of service', 'R1'),
 ('cart-both', llm, {'spec.cart.selector': 'app=cart'}, 'spec.cart: set only one of service or selector', 'R1'),
 ('cart-neither', llm, {'spec.cart.service': DEL}, 'spec.cart: set exactly one of service', 'R1'),
 ('discovery-missing', llm, {'spec.discovery': DEL}, 'spec.discovery: set exactly one of service', 'R1'),
 # rule 2: cart peer needs spec.cart
 ('cart-peer-without-cart', llm, {'spec.cart': DEL}, 'spec.nginx.peers.0.use: a peer with use: cart requires spec.cart', 'R2'),
 ('cart-peer-only-without-cart', minimal, {'spec.nginx.peers': [{'use': 'cart'}]}, 'a peer with use: cart requires spec.cart', 'R2'),
 ('cart-peer-last-without-cart', minimal, {'spec.nginx.peers': [{'use': 'backend'}, {'use': 'cart', 'priority': 5}]}, 'spec.nginx.peers.1.use: a peer with use: cart requires spec.cart', 'R2'),
 # rule 3: maxConcurrencyFromBackend
 ('mcfb-no-backend-limit', llm, {'spec.nginx.peers.1.maxConcurrency': DEL}, 'maxConcurrencyFromBackend: true needs a use: backend peer with maxConcurrency > 0', 'R3'),
 ('mcfb-no-backend-peer', llm, {'spec.nginx.peers': [{'use': 'cart', 'maxConcurrencyFromBackend': True}, {'use': 'backend-svc'}]}, 'maxConcurrencyFromBackend: true needs a use: backend peer', 'R3'),
 ('mcfb-backend-limit-zero', llm, {'spec.nginx.peers.1.maxConcurrency': 0}, 'maxConcurrencyFromBackend: true needs a use: backend peer with maxConcurrency > 0', 'R3'),
 ('mcfb-on-backend', llm, {'spec.nginx.peers.1.maxConcurrencyFromBackend': True}, 'maxConcurrencyFromBackend is only for use: cart peers', 'R3'),
 ('mcfb-on-backend-svc', llm, {'spec.nginx.peers.2.maxConcurrencyFromBackend': True}, 'maxConcurrencyFromBackend is only for use: cart peers', 'R3'),
 ('mcfb-not-bool', llm, {'spec.nginx.peers.0.maxConcurrencyFromBackend': 'yes'}, 'maxConcurrencyFromBackend must be true or false', 'R3'),
 # rule 4: route charset
 ('route-uppercase', llm, {'spec.nginx.route': 'Qwen'}, 'route must use only a-z, 0-9', 'R4'),
 ('route-slash', llm, {'spec.nginx.route': 'qwen/v2'}, 'route must use only a-z, 0-9', 'R4'),
 ('route-space', llm, {'spec.nginx.route': 'qwen 72b'}, 'route must use only a-z, 0-9', 'R4'),
 ('route-empty', llm, {'spec.nginx.route': ''}, 'route must use only a-z, 0-9', 'R4'),
 ('route-too-long', llm, {'spec.nginx.route': 'a'*64}, 'route is longer than 63 characters', 'R4'),
 ('route-default-too-long', minimal, {'metadata.name': 'm'*70}, 'route is longer than 63 characters', 'R4'),
 ('route-default-from-invalid-name', minimal, {'metadata.name': 'Qwen-72B'}, 'metadata.name must be a lowercase DNS name', 'R4'),
 ('route-not-string', llm, {'spec.nginx.route': 42}, 'route must be a string', 'R4'),
 # rule 5: video
 ('video-with-cart', video, {'spec.cart': {'service': 'c', 'outputConfigMap': 'c'}}, 'spec.cart: video routes cannot use cart', 'R5'),
 ('video-with-slo', video, {'spec.slo': {'ttftMs': 100}}, 'spec.slo: video routes cannot use slo', 'R5'),
 ('video-with-monitor', video, {'spec.monitor': {'outputConfigMap': 'm'}}, 'spec.monitor: video routes cannot use monitor', 'R5'),
 ('video-unknown-value', video, {'spec.nginx.values.tps_limit_tps': '30'}, 'spec.nginx.values.tps_limit_tps: tps_limit_tps is not a video option', 'R5'),
 ('video-unknown-value-default-max', video, {'spec.nginx.values.default_max': '10'}, 'default_max is not a video option', 'R5'),
 ('video-cart-peer', video, {'spec.nginx.peers.0.use': 'cart'}, 'video routes render a plain reverse proxy: use backend or backend-svc', 'R5'),
 ('video-rate-limit-lower-gbps', video, {'spec.nginx.values.rate_limit': '1.5gbps'}, 'rate_limit must be bits per second', 'R5'),
 ('video-rate-limit-decimal-size', video, {'spec.nginx.values.rate_limit': '1.5m'}, 'rate_limit must be bits per second', 'R5'),
 ('video-rate-limit-zero', video, {'spec.nginx.values.rate_limit': '0'}, 'rate_limit must be bits per second', 'R5'),
 ('video-rate-limit-words', video, {'spec.nginx.values.rate_limit': 'fast'}, 'rate_limit must be bits per second', 'R5'),
 ('video-rate-limit-space', video, {'spec.nginx.values.rate_limit': '200 Mbps'}, 'rate_limit must be bits per second', 'R5'),
 ('video-rate-limit-mbs', video, {'spec.nginx.values.rate_limit': '200MBps'}, 'rate_limit must be bits per second', 'R5'),
 ('video-req-limit-per-hour', video, {'spec.nginx.values.upload_req_limit': '10r/h'}, 'upload_req_limit must be in nginx form such as 10r/s or 600r/m', 'R5'),
 ('video-req-limit-plain', video, {'spec.nginx.values.upload_req_limit': '10'}, 'upload_req_limit must be in nginx form', 'R5'),
 ('video-req-limit-zero', video, {'spec.nginx.values.upload_req_limit': '0r/s'}, 'upload_req_limit must be in nginx form', 'R5'),
 ('video-burst-without-limit', video, {'spec.nginx.values.upload_req_burst': '5'}, 'upload_req_burst needs upload_req_limit', 'R5'),
 ('video-burst-not-number', video, {'spec.nginx.values.upload_req_limit': '10r/s', 'spec.nginx.values.upload_req_burst': 'lots'}, 'upload_req_burst must be a whole number', 'R5'),
 ('video-conn-limit-zero', video, {'spec.nginx.values.upload_conn_limit': '0'}, 'upload_conn_limit must be a whole number of connections', 'R5'),
 ('video-body-size-bad', video, {'spec.nginx.values.max_body_size': '64 MB'}, 'max_body_size must be an nginx size', 'R5'),
 ('video-timeout-bad', video, {'spec.nginx.values.proxy_timeout': '1 hour'}, 'proxy_timeout must be an nginx time', 'R5'),
 ('video-connect-timeout-bad', video, {'spec.nginx.values.connect_timeout': '-1s'}, 'connect_timeout must be an nginx time', 'R5'),
 ('video-rate-after-bad', video, {'spec.nginx.values.rate_limit_after': '1.5m'}, 'rate_limit_after must be an nginx size', 'R5'),
 ('video-api-keys-space', video, {'spec.nginx.values.api_keys': 'sk-1, sk-2'}, 'api_keys must be comma-separated tokens', 'R5'),
 ('video-api-keys-empty-item', video, {'spec.nginx.values.api_keys': 'sk-1,,sk-2'}, 'api_keys must be comma-separated tokens', 'R5'),
 ('video-api-keys-newline', video, {'spec.nginx.values.api_keys': 'sk-1\nsk-2'}, 'api_keys must be comma-separated tokens', 'R5'),
 ('video-limit-key-bad', video, {'spec.nginx.values.upload_limit_key': 'binary_remote_addr'}, 'upload_limit_key must be one nginx variable', 'R5'),
 ('video-public-paths-newline', video, {'spec.nginx.values.auth_public_paths': '~^/a\n}'}, 'auth_public_paths must be an nginx map key', 'R5'),
 # rule 6: shapes
 ('port-zero', llm, {'spec.discovery.port': 0}, 'spec.discovery.port: port must be a whole number from 1 to 65535', 'R6'),
 ('port-65536', llm, {'spec.discovery.port': 65536}, 'spec.discovery.port: port must be a whole number from 1 to 65535', 'R6'),
 ('port-negative', llm, {'spec.discovery.port': -1}, 'port must be a whole number from 1 to 65535', 'R6'),
 ('port-string', llm, {'spec.discovery.port': '8000'}, 'port must be a whole number from 1 to 65535', 'R6'),
 ('port-float', llm, {'spec.discovery.port': 8000.5}, 'port must be a whole number from 1 to 65535', 'R6'),
 ('cart-port-65536', llm, {'spec.cart.port': 65536}, 'spec.cart.port: port must be a whole number', 'R6'),
 ('service-too-many-slashes', llm, {'spec.discovery.service': 'a/b/c'}, 'spec.discovery.service: must be a Service name or namespace/name', 'R6'),
 ('service-uppercase', llm, {'spec.discovery.service': 'LLM/Qwen'}, 'must be a Service name or namespace/name', 'R6'),
 ('service-empty', llm, {'spec.discovery.service': ''}, 'must be a Service name or namespace/name', 'R6'),
 ('service-leading-slash', llm, {'spec.discovery.service': '/qwen'}, 'must be a Service name or namespace/name', 'R6'),
 ('service-digit-start', llm, {'spec.discovery.service': 'llm/7b'}, 'must be a Service name or namespace/name', 'R6'),
 ('selector-empty', minimal, {'spec.discovery.selector': ''}, 'spec.discovery.selector: must be a label selector', 'R6'),
 ('selector-garbage', minimal, {'spec.discovery.selector': 'app==='}, 'must be a label selector', 'R6'),
 ('selector-trailing-comma', minimal, {'spec.discovery.selector': 'app=a,'}, 'must be a label selector', 'R6'),
 ('nginx-outputcm-missing', llm, {'spec.nginx.outputConfigMap': DEL}, 'spec.nginx.outputConfigMap: this field is required', 'R6'),
 ('nginx-outputcm-bad', llm, {'spec.nginx.outputConfigMap': 'a/b/c'}, 'must be a ConfigMap name or namespace/name', 'R6'),
 ('nginx-outputcm-empty', llm, {'spec.nginx.outputConfigMap': ''}, 'must be a ConfigMap name or namespace/name', 'R6'),
 ('cart-outputcm-missing', llm, {'spec.cart.outputConfigMap': DEL}, 'spec.cart.outputConfigMap: this field is required', 'R6'),
 ('monitor-outputcm-missing', llm, {'spec.monitor.outputConfigMap': DEL}, 'spec.monitor.outputConfigMap: this field is required', 'R6'),
 ('monitor-model-space', llm, {'spec.monitor.model': 'Qwen 72B'}, 'model must be a served model name', 'R6'),
 ('monitor-gpu-bad', llm, {'spec.monitor.gpuType': 'H100 80GB'}, 'gpuType must be a short name', 'R6'),
 ('monitor-nginx-not-bool', llm, {'spec.monitor.nginx': 'yes'}, 'monitor.nginx must be true or false', 'R6'),
 ('peers-empty', llm, {'spec.nginx.peers': []}, 'spec.nginx.peers: peers needs at least one peer', 'R6'),
 ('peers-missing', llm, {'spec.nginx.peers': DEL}, 'spec.nginx.peers: peers needs at least one peer', 'R6'),
 ('peer-use-unknown', llm, {'spec.nginx.peers.2.use': 'backend_svc'}, 'use must be cart, backend or backend-svc', 'R6'),
 ('peer-use-missing', llm, {'spec.nginx.peers.2': {'priority': 1}}, 'every peer needs use: cart, backend or backend-svc', 'R6'),
 ('peer-use-twice', llm, {'spec.nginx.peers.2.use': 'backend'}, 'each use may appear once; backend is listed twice', 'R6'),
 ('peer-priority-negative', llm, {'spec.nginx.peers.0.priority': -1}, 'priority must be a whole number from 0 to 1000', 'R6'),
 ('peer-priority-string', llm, {'spec.nginx.peers.0.priority': 'high'}, 'priority must be a whole number from 0 to 1000', 'R6'),
 ('peer-maxconc-huge', minimal, {'spec.nginx.peers.0.maxConcurrency': 2000000}, 'maxConcurrency must be a whole number from 1 to 1000000', 'R6'),
 ('peer-probe-relative', llm, {'spec.nginx.peers.0.probePath': 'health'}, 'probePath must be an absolute path', 'R6'),
 ('peer-probe-space', llm, {'spec.nginx.peers.0.probePath': '/he alth'}, 'probePath must be an absolute path', 'R6'),
 ('cart-maxload-zero', llm, {'spec.cart.maxLoad': 0}, 'maxLoad must be a whole number from 1 to 1000000', 'R6'),
 ('modeltype-unknown', llm, {'spec.modelType': 'image'}, 'spec.modelType: modelType must be llm or video', 'R6'),
 ('modeltype-uppercase', llm, {'spec.modelType': 'LLM'}, 'modelType must be llm or video', 'R6'),
 ('values-number', llm, {'spec.nginx.values': {'tps_limit_tps': 30}}, 'spec.nginx.values.tps_limit_tps: conflicting values', 'R6'),
 ('values-bad-key', llm, {'spec.nginx.values': {'bad key': 'x'}}, 'bad key is not an option name', 'R6'),
 ('slo-ttft-zero', llm, {'spec.slo': {'ttftMs': 0}}, 'ttftMs must be a whole number of milliseconds', 'R6'),
 ('slo-decode-string', llm, {'spec.slo': {'decodeTokensPerSecond': 'ten'}}, 'decodeTokensPerSecond must be a whole number', 'R6'),
 ('slo-and-value', llm, {'spec.slo': {'ttftMs': 2000}, 'spec.nginx.values': {'slo_ttft_ms': '1000'}}, 'set either spec.slo.ttftMs or spec.nginx.values.slo_ttft_ms, not both', 'R6'),
 ('slo-unknown-field', llm, {'spec.slo': {'ttft': 2000}}, 'spec.slo.ttft: unknown field', 'R6'),
 ('include-not-ready-string', llm, {'spec.discovery.includeNotReady': 'true'}, 'includeNotReady must be true or false', 'R6'),
 ('unknown-spec-field', llm, {'spec.replicas': 2}, 'spec.replicas: unknown field', 'R6'),
 ('unknown-nginx-field', llm, {'spec.nginx.peer': []}, 'spec.nginx.peer: unknown field', 'R6'),
 ('unknown-discovery-field', llm, {'spec.discovery.namespace': 'llm'}, 'spec.discovery.namespace: unknown field', 'R6'),
 ('unknown-peer-field', llm, {'spec.nginx.peers.0.weight': 2}, 'spec.nginx.peers.0.weight: unknown field', 'R6'),
 ('wrong-kind', llm, {'kind': 'ModelRouter'}, 'kind: kind must be ModelRoute', 'R6'),
 ('wrong-apiversion', llm, {'apiVersion': 'routing.modelsphere.dev/v1'}, 'apiVersion: apiVersion must be routing.modelsphere.dev/v1alpha1', 'R6'),
 ('namespace-bad', llm, {'metadata.namespace': 'LLM_route'}, 'metadata.namespace: metadata.namespace must be a lowercase DNS label', 'R6'),
 ('name-missing', minimal, {'metadata.name': DEL}, 'metadata.name: this field is required', 'R6'),
 ('spec-missing', llm, {'spec': DEL}, 'spec.discovery: set exactly one of service', 'R6'),
 ('nginx-missing', llm, {'spec.nginx': DEL}, 'spec.nginx.peers: peers needs at least one peer', 'R6'),
 ('failuremode-lowercase', llm, {'spec.failureMode': 'failopen'}, 'spec.failureMode: failureMode must be FailOpen or FailClose', 'R6'),
 ('failuremode-bool', llm, {'spec.failureMode': True}, 'failureMode must be FailOpen or FailClose', 'R6'),
 ('nginx-entry-service-bad', llm, {'spec.nginx.service': 'Openresty'}, 'spec.nginx.service: must be a Service name or namespace/name', 'R6'),
]
valid = [
 ('llm-full', llm, {}),
 ('llm-minimal-selector', minimal, {}),
 ('video-defaults', video, {'spec.nginx.values': {}}),
 ('video-all-values', video, {'spec.nginx.values': {'max_body_size': '128m', 'proxy_timeout': '2h', 'connect_timeout': '5s', 'rate_limit': '1.5Gbps', 'rate_limit_after': '2m', 'upload_conn_limit': '8', 'upload_req_limit': '600r/m', 'upload_req_burst': '0', 'api_keys': 'k1,K1,"q\'}#$;', 'auth_public_paths': '', 'upload_limit_key': '$http_x_forwarded_for'}}),
 ('video-rate-nginx-size', video, {'spec.nginx.values.rate_limit': '25m'}),
 ('video-rate-plain-bytes', video, {'spec.nginx.values.rate_limit': '1048576'}),
 ('video-rate-kbps', video, {'spec.nginx.values.rate_limit': '512k'}),
 ('port-edges', llm, {'spec.discovery.port': 65535, 'spec.cart.port': 1}),
 ('selector-set-based', minimal, {'spec.discovery.selector': 'app in (qwen,qwen-canary),tier!=test,!legacy'}),
 ('route-dots-underscores', minimal, {'spec.nginx.route': 'qwen_2.5-72b'}),
 ('route-63', minimal, {'spec.nginx.route': 'r'*63}),
 ('llm-hostile-values', minimal, {'spec.nginx.values': {'q': '"\'\\]]=]];}#$\n{', 'tps_limit_tps': '30'}}),
 ('cart-selector-mode', llm, {'spec.cart.service': DEL, 'spec.cart.selector': 'app=qwen-cart', 'spec.discovery.service': DEL, 'spec.discovery.selector': 'app=qwen'}),
 ('entry-service-and-selector', llm, {'spec.nginx.service': 'llm-route/openresty', 'spec.nginx.selector': 'app=openresty'}),
 ('peers-equal-priority', minimal, {'spec.nginx.peers': [{'use': 'backend', 'priority': 1}, {'use': 'backend-svc', 'priority': 1}]}),
 ('failopen-selector', minimal, {'spec.failureMode': 'FailOpen'}),
 ('failclose-cart', llm, {'spec.failureMode': 'FailClose'}),
 ('no-namespace-bare-names', minimal, {'spec.discovery': {'service': 'qwen', 'port': 8000, 'includeNotReady': True}}),
]
import shutil
for d in ('valid','invalid'):
    shutil.rmtree(os.path.join(root,d), ignore_errors=True); os.makedirs(os.path.join(root,d))
class D(yaml.SafeDumper): pass
def str_rep(dumper, data):
    if '\n' in data: return dumper.represent_scalar('tag:yaml.org,2002:str', data, style='"')
    return dumper.represent_scalar('tag:yaml.org,2002:str', data)
D.add_representer(str, str_rep)
seen=set()
for name, base, muts, want, rule in cases:
    assert name not in seen; seen.add(name)
    doc = base()
    for p, v in muts.items(): setp(doc, p, v)
    with open(os.path.join(root,'invalid',name+'.yaml'),'w') as f:
        f.write('# want: %s\n' % want)
        # autoconfig vet rewrites CUE's few generic messages; cue vet prints them raw.
        cue = want
        if want == 'metadata.name: this field is required': cue = '_named: non-concrete value string'
        elif want.endswith(': unknown field'): cue = want.replace(': unknown field', ': field not allowed')
        elif want.endswith(': this field is required'): cue = want.replace(': this field is required', ': incomplete value')
        elif want == 'every peer needs use: cart, backend or backend-svc': cue = 'non-concrete value =~"^(cart|backend|backend-svc)$"'
        if cue != want: f.write('# want-cue: %s\n' % cue)
        f.write('# rule: %s\n' % rule)
        f.write(yaml.dump(doc, Dumper=D, sort_keys=False, allow_unicode=False))
for name, base, muts in valid:
    doc = base()
    for p, v in muts.items(): setp(doc, p, v)
    with open(os.path.join(root,'valid',name+'.yaml'),'w') as f:
        f.write(yaml.dump(doc, Dumper=D, sort_keys=False, allow_unicode=False))
print(len(cases), len(valid))
from collections import Counter
print(Counter(c[4] for c in cases))
