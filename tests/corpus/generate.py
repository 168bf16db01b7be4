#!/usr/bin/env python3
"""Writes the corpora of the secret scanner's tests (tests/corpus/):

- secrets/*.jsonl: generated secrets in context, one JSON object a line:
  {"kind": ..., "secret": ..., "text": ...} where `text` is what a command would print and
  holds `secret`. Each kind is generated from its provider's documented format, from this list
  of kinds only (no knowledge of the detectors):
  AWS access key id and secret key, GCP API key and service-account key file, Azure storage
  key and connection string, Azure client secret, GitHub tokens (classic and fine-grained),
  GitLab tokens, Slack tokens and webhook URLs, Lark/Feishu app secrets and access tokens,
  OpenAI and Anthropic API keys, Stripe keys, npm tokens, JWTs, PEM private keys (RSA, EC,
  PKCS#8, encrypted PKCS#8), OpenSSH private keys, URLs with a password, database connection
  strings, password/secret/token assignments in env, shell, YAML, JSON, INI, TOML and
  Kubernetes secret syntaxes, Authorization headers, and long random strings next to
  secret-ish names.
- ordinary/generated_*.txt: synthetic ordinary output of commands this machine cannot run
  (docker, kubectl, journalctl, ...); the other files of ordinary/ are real captured output.

Run from the repository root: python3 tests/corpus/generate.py. Deterministic (seeded),
except the private keys, which ssh-keygen and openssl make.
"""

import base64
import hashlib
import json
import os
import random
import string
import subprocess
import tempfile
import uuid

R = random.Random(46)
HERE = os.path.dirname(os.path.abspath(__file__))
UPPER = string.ascii_uppercase
LOWER = string.ascii_lowercase
DIGITS = string.digits
ALNUM = UPPER + LOWER + DIGITS
B64 = ALNUM + "+/"
B32 = UPPER + "234567"


def pick(alphabet, n):
    return "".join(R.choice(alphabet) for _ in range(n))


def b64(n_bytes, url=False, pad=True):
    raw = bytes(R.getrandbits(8) for _ in range(n_bytes))
    s = (base64.urlsafe_b64encode if url else base64.b64encode)(raw).decode()
    return s if pad else s.rstrip("=")


def hexs(n):
    return pick("0123456789abcdef", n)


def b64url_json(obj):
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")


# ---- generators per kind: each returns the secret value -------------------------------------


def aws_access_key_id():
    # AKIA (long-term) or ASIA (temporary) + 16 characters of base32.
    return R.choice(["AKIA", "ASIA"]) + pick(B32, 16)


def aws_secret_key():
    # 40 characters of base64 (30 random bytes).
    return b64(30)


def gcp_api_key():
    # "AIza" + 35 characters of [A-Za-z0-9_-].
    return "AIza" + pick(ALNUM + "_-", 35)


def azure_storage_key():
    # 64 random bytes, base64: 88 characters ending in "==".
    return b64(64)


def azure_client_secret():
    # 40 characters: 3 of [A-Za-z0-9], "8Q~" style marker (3 chars with ~), then 34.
    return pick(ALNUM, 3) + R.choice(DIGITS) + "Q~" + pick(ALNUM + "_~.-", 34)


def github_token():
    prefix = R.choice(["ghp_", "gho_", "ghu_", "ghs_", "ghr_"])
    return prefix + pick(ALNUM, 36)


def github_fine_grained():
    return "github_pat_" + pick(ALNUM, 22) + "_" + pick(ALNUM, 59)


def gitlab_token():
    prefix = R.choice(["glpat-", "gldt-", "glrt-", "glptt-"])
    return prefix + pick(ALNUM + "_-", 20)


def slack_token():
    kind = R.choice(["xoxb", "xoxp", "xoxa", "xoxr"])
    if kind == "xoxb":
        return f"xoxb-{pick(DIGITS, 12)}-{pick(DIGITS, 13)}-{pick(ALNUM, 24)}"
    return f"{kind}-{pick(DIGITS, 12)}-{pick(DIGITS, 12)}-{pick(DIGITS, 13)}-{hexs(32)}"


def slack_app_token():
    return f"xapp-1-A{pick(UPPER + DIGITS, 10)}-{pick(DIGITS, 13)}-{hexs(64)}"


def slack_webhook():
    return f"https://hooks.slack.com/services/T{pick(UPPER + DIGITS, 8)}/B{pick(UPPER + DIGITS, 10)}/{pick(ALNUM, 24)}"


def lark_app_secret():
    # Lark / Feishu app secrets: 32 characters of [A-Za-z0-9].
    return pick(ALNUM, 32)


def lark_access_token():
    # tenant_access_token "t-" / user_access_token "u-" + opaque characters.
    return R.choice(["t-", "u-"]) + "g" + pick(ALNUM + "_", 40)


def openai_key():
    style = R.choice(["legacy", "proj", "svcacct"])
    if style == "legacy":
        return "sk-" + pick(ALNUM, 20) + "T3BlbkFJ" + pick(ALNUM, 20)
    return f"sk-{style}-" + pick(ALNUM + "_-", 74) + "T3BlbkFJ" + pick(ALNUM + "_-", 74)


def anthropic_key():
    return "sk-ant-api03-" + pick(ALNUM + "_-", 93) + "AA"


def stripe_key():
    return R.choice(["sk_live_", "rk_live_", "sk_test_"]) + pick(ALNUM, 99)


def npm_token():
    return "npm_" + pick(ALNUM, 36)


def jwt():
    header = b64url_json({"alg": R.choice(["HS256", "RS256", "ES256"]), "typ": "JWT"})
    payload = b64url_json(
        {
            "sub": str(uuid.UUID(int=R.getrandbits(128))),
            "iss": R.choice(["https://auth.example.com", "kubernetes/serviceaccount", "api"]),
            "iat": 1764800000 + R.randrange(100000),
            "exp": 1764900000 + R.randrange(100000),
            "scope": R.choice(["read write", "admin", "deploy"]),
        }
    )
    sig = b64(R.choice([32, 64, 256]), url=True, pad=False)
    return f"{header}.{payload}.{sig}"


def password():
    # People's passwords: mixed styles.
    style = R.choice(["words", "random", "symbols"])
    if style == "words":
        words = ["correct", "horse", "battery", "staple", "Winter", "Summer", "river", "Falcon", "blue"]
        return R.choice(words) + R.choice(words) + str(R.randrange(10, 9999)) + R.choice("!#$%")
    if style == "random":
        return pick(ALNUM, R.randrange(12, 24))
    return pick(ALNUM + "!#%^*()-_+", R.randrange(14, 28))


def hex_secret():
    return hexs(R.choice([32, 40, 64]))


def random_token():
    return pick(ALNUM + "_-", R.randrange(24, 48))


def private_key(kind):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "k")
        if kind == "openssh-ed25519":
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", p], check=True)
        elif kind == "openssh-rsa":
            subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-f", p], check=True)
        elif kind == "openssh-encrypted":
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", p], check=True)
        elif kind == "pem-rsa":
            subprocess.run(["openssl", "genrsa", "-traditional", "-out", p, "2048"], check=True, capture_output=True)
        elif kind == "pem-ec":
            subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", p], check=True, capture_output=True)
        elif kind == "pkcs8":
            subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", p], check=True, capture_output=True)
        elif kind == "pkcs8-encrypted":
            subprocess.run(
                ["openssl", "genpkey", "-algorithm", "rsa", "-pkeyopt", "rsa_keygen_bits:2048", "-aes-256-cbc", "-pass", "pass:x", "-out", p],
                check=True,
                capture_output=True,
            )
        with open(p) as f:
            return f.read().strip()


# ---- contexts ----------------------------------------------------------------------------


def env_name(base):
    return R.choice([base, "PROD_" + base, base + "_PROD", "APP_" + base])


def assignment(name, value):
    """A `name = value` in one of the syntaxes commands print."""
    style = R.choice(["env", "export", "yaml", "json", "ini", "toml", "docker", "compose", "quoted"])
    if style == "env":
        return f"{name}={value}"
    if style == "export":
        return f"export {name}='{value}'"
    if style == "yaml":
        return f"  {name.lower()}: {value}"
    if style == "json":
        return f'    "{name.lower()}": "{value}",'
    if style == "ini":
        return f"{name.lower()} = {value}"
    if style == "toml":
        return f'{name.lower()} = "{value}"'
    if style == "docker":
        return f'                "{name}={value}",'
    if style == "compose":
        return f"      - {name}={value}"
    return f'{name}="{value}"'


def cases():
    out = []

    def add(kind, secret, text):
        assert secret in text, (kind, secret, text)
        out.append({"kind": kind, "secret": secret, "text": text})

    for _ in range(10):
        s = aws_access_key_id()
        add("aws-access-key-id", s, R.choice([assignment("AWS_ACCESS_KEY_ID", s), f"aws_access_key_id = {s}", f"| AccessKeyId | {s} |"]))
    for _ in range(10):
        s = aws_secret_key()
        add("aws-secret-key", s, R.choice([assignment(env_name("AWS_SECRET_ACCESS_KEY"), s), f"aws_secret_access_key = {s}", f'        "SecretAccessKey": "{s}",']))
    for _ in range(8):
        s = gcp_api_key()
        add("gcp-api-key", s, R.choice([assignment("GOOGLE_API_KEY", s), f"curl 'https://maps.googleapis.com/maps/api/geocode/json?address=Berlin&key={s}'", f"apiKey: {s}"]))
    for _ in range(4):
        pem = private_key("pkcs8")
        escaped = pem.replace("\n", "\\n") + "\\n"
        text = "{\n" + f'  "type": "service_account",\n  "project_id": "prod-{pick(LOWER, 6)}",\n  "private_key_id": "{hexs(40)}",\n  "private_key": "{escaped}",\n  "client_email": "deploy@prod.iam.gserviceaccount.com"\n' + "}"
        add("gcp-service-account-key", escaped, text)
    for _ in range(6):
        s = azure_storage_key()
        add("azure-storage-key", s, R.choice([
            f"DefaultEndpointsProtocol=https;AccountName=prod{pick(LOWER, 6)};AccountKey={s};EndpointSuffix=core.windows.net",
            assignment("AZURE_STORAGE_KEY", s),
        ]))
    for _ in range(6):
        s = azure_client_secret()
        add("azure-client-secret", s, R.choice([assignment("AZURE_CLIENT_SECRET", s), f'  "clientSecret": "{s}",', f"client_secret={s}"]))
    for _ in range(10):
        s = github_token()
        add("github-token", s, R.choice([
            f"origin\thttps://{s}@github.com/acme/infra.git (fetch)",
            assignment("GITHUB_TOKEN", s),
            f"  oauth_token: {s}",
            f"ghtoken {s}",
        ]))
    for _ in range(5):
        s = github_fine_grained()
        add("github-fine-grained-token", s, R.choice([assignment("GH_TOKEN", s), f"password {s}"]))
    for _ in range(8):
        s = gitlab_token()
        add("gitlab-token", s, R.choice([
            f"origin\thttps://oauth2:{s}@gitlab.example.com/group/app.git (push)",
            assignment("CI_JOB_TOKEN", s),
            f"PRIVATE-TOKEN: {s}",
            f"registered runner with {s}",
        ]))
    for _ in range(8):
        s = slack_token()
        add("slack-token", s, R.choice([assignment("SLACK_BOT_TOKEN", s), f"token: {s}", f"using {s} for #alerts"]))
    for _ in range(3):
        s = slack_app_token()
        add("slack-app-token", s, assignment("SLACK_APP_TOKEN", s))
    for _ in range(5):
        s = slack_webhook()
        add("slack-webhook", s, R.choice([assignment("SLACK_WEBHOOK_URL", s), f"curl -X POST -d @msg.json {s}", f"  webhook: {s}"]))
    for _ in range(8):
        s = lark_app_secret()
        add("lark-app-secret", s, R.choice([assignment("LARK_APP_SECRET", s), f'{{"app_id":"cli_{hexs(16)}","app_secret":"{s}"}}', assignment("FEISHU_APP_SECRET", s)]))
    for _ in range(6):
        s = lark_access_token()
        add("lark-access-token", s, R.choice([
            f'{{"code":0,"expire":7200,"msg":"ok","tenant_access_token":"{s}"}}',
            f"Authorization: Bearer {s}",
        ]))
    for _ in range(10):
        s = openai_key()
        add("openai-key", s, R.choice([assignment("OPENAI_API_KEY", s), f"llm_api_key: {s}", f"Incorrect API key provided: {s}.", assignment("LLM_API_KEY", s)]))
    for _ in range(5):
        s = anthropic_key()
        add("anthropic-key", s, R.choice([assignment("ANTHROPIC_API_KEY", s), f"x-api-key: {s}"]))
    for _ in range(5):
        s = stripe_key()
        add("stripe-key", s, R.choice([assignment("STRIPE_SECRET_KEY", s), f"Stripe.api_key = '{s}'"]))
    for _ in range(4):
        s = npm_token()
        add("npm-token", s, R.choice([f"//registry.npmjs.org/:_authToken={s}", assignment("NPM_TOKEN", s)]))
    for _ in range(12):
        s = jwt()
        add("jwt", s, R.choice([
            f"Authorization: Bearer {s}",
            f"token: {s}",
            f'{{"access_token":"{s}","token_type":"Bearer","expires_in":3600}}',
            f"set-cookie: session={s}; Path=/; HttpOnly",
            s,
        ]))
    for kind, n in [("openssh-ed25519", 5), ("openssh-rsa", 3), ("openssh-encrypted", 2), ("pem-rsa", 4), ("pem-ec", 3), ("pkcs8", 3), ("pkcs8-encrypted", 2)]:
        for _ in range(n):
            pem = private_key(kind)
            before = R.choice(["$ cat ~/.ssh/id_deploy", "root@web-01:~# cat /etc/ssl/private/server.key", "ssh_key: |", ""])
            body = pem if not before.endswith("|") else "\n".join("  " + l for l in pem.splitlines())
            add("private-key" if not kind.startswith("openssh") else "openssh-private-key", body, f"{before}\n{body}\nroot@web-01:~# ".lstrip("\n"))
    for _ in range(10):
        pw = password()
        user = R.choice(["deploy", "admin", "app", "git", "backup"])
        host = R.choice(["db.internal", "10.0.3.17", "git.example.com", "cache-1.prod", "mq.example.net:5672"])
        scheme = R.choice(["https", "postgres", "mysql", "redis", "amqp", "ftp", "mongodb"])
        add("url-password", pw, f"{scheme}://{user}:{pw}@{host}/{R.choice(['app', 'repo.git', '0', 'vhost', ''])}")
    for _ in range(10):
        pw = password()
        style = R.choice(["ado", "jdbc", "mongo", "libpq", "odbc"])
        if style == "ado":
            t = f"Server=tcp:sql-prod.database.windows.net,1433;Initial Catalog=app;User ID=app;Password={pw};Encrypt=True;"
        elif style == "jdbc":
            t = f"jdbc:postgresql://db.internal:5432/app?user=app&password={pw}&ssl=true"
        elif style == "mongo":
            t = f"mongodb+srv://app:{pw}@cluster0.{pick(LOWER + DIGITS, 5)}.mongodb.net/prod?retryWrites=true"
        elif style == "libpq":
            t = f"host=db.internal port=5432 dbname=app user=app password={pw} sslmode=require"
        else:
            t = f"Driver={{ODBC Driver 18 for SQL Server}};Server=db;Uid=sa;Pwd={pw};"
        add("connection-string", pw, t)
    names = ["DB_PASSWORD", "POSTGRES_PASSWORD", "MYSQL_ROOT_PASSWORD", "REDIS_PASSWORD", "SECRET_KEY", "JWT_SECRET",
             "SESSION_SECRET", "API_TOKEN", "AUTH_TOKEN", "ACCESS_TOKEN", "CLIENT_SECRET", "SMTP_PASSWORD", "password",
             "secret", "token", "api_key", "apiKey", "passwd", "RABBITMQ_DEFAULT_PASS", "ENCRYPTION_KEY", "WEBHOOK_SECRET"]
    for _ in range(40):
        v = R.choice([password, hex_secret, random_token, lambda: b64(R.choice([24, 32, 48]))])()
        add("assignment", v, assignment(R.choice(names), v))
    for _ in range(8):
        v = password()
        add("kubernetes-secret", base64.b64encode(v.encode()).decode(), "apiVersion: v1\ndata:\n  " + R.choice(["password", "db-password", "token", "api-key"]) + ": " + base64.b64encode(v.encode()).decode() + "\nkind: Secret\nmetadata:\n  name: app-credentials\ntype: Opaque")
    for _ in range(6):
        v = pick(ALNUM + "._-", R.randrange(30, 60))
        add("authorization-bearer", v, R.choice([f"Authorization: Bearer {v}", f"> authorization: bearer {v}", f"curl -H 'Authorization: Bearer {v}' https://api.example.com/v1/me"]))
    for _ in range(6):
        cred = base64.b64encode(f"{R.choice(['admin', 'ci', 'deploy'])}:{password()}".encode()).decode()
        add("authorization-basic", cred, R.choice([f"Authorization: Basic {cred}", f"> Authorization: Basic {cred}"]))
    for _ in range(8):
        v = R.choice([hex_secret, random_token, lambda: b64(32)])()
        name = R.choice(["signing_key", "hmac_key", "master_key", "client_secret", "auth", "credential", "private_token", "bot_key"])
        add("entropy-named", v, R.choice([f"{name}: {v}", f"--{name.replace('_', '-')} {v}", f"{name.upper()}={v}"]))
    return out


# ---- ordinary output this machine cannot produce ------------------------------------------


def ts(i):
    return f"Dec 04 {8 + i // 3600:02d}:{(i // 60) % 60:02d}:{i % 60:02d}"


def ordinary():
    files = {}
    images = ["nginx:1.27-alpine", "postgres:16", "redis:7.4", "ghcr.io/acme/api:v2.14.3", "grafana/grafana:11.3.0", "prom/prometheus:v2.55.1", "traefik:v3.2"]
    names = ["api", "worker", "db", "cache", "proxy", "grafana", "prometheus", "scheduler"]
    lines = ["CONTAINER ID   IMAGE                         COMMAND                  CREATED        STATUS                  PORTS                                       NAMES"]
    for i in range(60):
        lines.append(f"{hexs(12)}   {R.choice(images):<29} \"{R.choice(['/docker-entrypoint.…', 'docker-entrypoint.s…', '/bin/sh -c ./run', 'redis-server'])}\"   {R.randrange(2, 59)} {R.choice(['minutes', 'hours', 'days'])} ago   Up {R.randrange(1, 59)} {R.choice(['minutes', 'hours'])} (healthy)   0.0.0.0:{R.randrange(3000, 9999)}->{R.choice([80, 443, 5432, 6379, 8080])}/tcp   {R.choice(names)}-{i}")
    lines.append("REPOSITORY                 TAG            IMAGE ID       CREATED        SIZE")
    for i in range(30):
        img = R.choice(images).split(":")
        lines.append(f"{img[0]:<26} {img[1]:<14} {hexs(12)}   {R.randrange(1, 30)} days ago    {R.randrange(20, 900)}MB")
    for i in range(20):
        lines.append(f"{R.choice(images).split(':')[0]}@sha256:{hexs(64)}")
    files["generated_docker.txt"] = lines

    lines = ["NAME                                   READY   STATUS             RESTARTS      AGE    IP            NODE"]
    for i in range(80):
        app = R.choice(["api", "web", "worker", "redis", "postgres", "ingress-nginx-controller", "coredns", "cert-manager"])
        lines.append(f"{app}-{pick(LOWER + DIGITS, 10)}-{pick(LOWER + DIGITS, 5):<14} {R.choice(['1/1', '2/2', '0/1'])}     {R.choice(['Running', 'Running', 'Pending', 'CrashLoopBackOff', 'Completed']):<18} {R.randrange(0, 12)} ({R.randrange(1, 59)}m ago)   {R.randrange(1, 40)}d    10.244.{R.randrange(0, 4)}.{R.randrange(2, 250)}   node-{R.randrange(1, 6)}")
    lines.append("NAME                  TYPE                                  DATA   AGE")
    for i in range(15):
        lines.append(f"{R.choice(['app-credentials', 'default-token-' + pick(LOWER + DIGITS, 5), 'tls-cert', 'registry-auth'])}   {R.choice(['Opaque', 'kubernetes.io/tls', 'kubernetes.io/dockerconfigjson', 'kubernetes.io/service-account-token'])}   {R.randrange(1, 4)}      {R.randrange(1, 300)}d")
    for i in range(40):
        event = R.choice(['Successfully assigned default/api-7d9f to node-2', 'Container image "ghcr.io/acme/api:v2.14.3" already present on machine', 'Created container api', 'Started container api', 'Stopping container api'])
        lines.append(f"  Normal   {R.choice(['Scheduled', 'Pulled', 'Created', 'Started', 'Killing'])}  {R.randrange(1, 59)}m   {R.choice(['kubelet', 'default-scheduler'])}  {event}")
    lines.append(f"  uid: {uuid.UUID(int=R.getrandbits(128))}")
    lines.append(f"  resourceVersion: \"{R.randrange(10**6, 10**8)}\"")
    files["generated_kubectl.txt"] = lines

    lines = []
    units = ["nginx.service", "sshd[1123]", "systemd[1]", "kernel", "postgres[882]", "dockerd[611]", "cron[540]", "sshmode[2201]"]
    for i in range(220):
        u = R.choice(units)
        msg = R.choice([
            f"Accepted publickey for deploy from 10.0.{R.randrange(256)}.{R.randrange(256)} port {R.randrange(30000, 65000)} ssh2: ED25519 SHA256:{b64(32, pad=False)[:43]}",
            "Started Daily apt download activities.",
            f"pam_unix(sshd:session): session opened for user deploy(uid=1000) by (uid=0)",
            f"{R.randrange(1000)} GET /api/v1/health HTTP/1.1 200 {R.randrange(20, 900)} \"-\" \"kube-probe/1.31\"",
            f"LOG:  checkpoint complete: wrote {R.randrange(1000)} buffers ({R.random():.1f}%); 0 WAL file(s) added, 0 removed",
            f"time=\"2026-12-04T{R.randrange(24):02d}:{R.randrange(60):02d}:{R.randrange(60):02d}.{R.randrange(10**6):06d}Z\" level=info msg=\"ignoring event\" container={hexs(64)} module=libcontainerd namespace=moby topic=/tasks/delete type=\"*events.TaskDelete\"",
            f"({R.choice(['root', 'deploy'])}) CMD (/usr/local/bin/backup.sh --target s3://backups/prod >/dev/null 2>&1)",
            f"EXT4-fs (sda1): mounted filesystem {uuid.UUID(int=R.getrandbits(128))} r/w with ordered data mode. Quota mode: none.",
            f"{{\"timestamp\":\"2026-12-04T10:{R.randrange(60):02d}:{R.randrange(60):02d}.{R.randrange(1000):03d}Z\",\"level\":\"INFO\",\"fields\":{{\"message\":\"turn finished\",\"section.id\":\"oc_{hexs(32)}\",\"duration_ms\":{R.randrange(9000)}}},\"target\":\"sshmode::agent\"}}",
            f"Received disconnect from 10.0.{R.randrange(256)}.{R.randrange(256)} port {R.randrange(30000, 65000)}:11: disconnected by user",
            f"upstream timed out (110: Connection timed out) while reading response header from upstream, client: 203.0.113.{R.randrange(256)}, server: example.com, request: \"GET /api/v2/items?page={R.randrange(50)}&sort=desc HTTP/1.1\", upstream: \"http://127.0.0.1:8080/api/v2/items?page=3\"",
        ])
        lines.append(f"{ts(i * 37)} web-01 {u}: {msg}")
    files["generated_journalctl.txt"] = lines

    lines = []
    for i in range(60):
        lines.append(str(uuid.UUID(int=R.getrandbits(128))))
    for i in range(40):
        lines.append(f"{hexs(64)}  release/sshmode-{R.randrange(1, 9)}.{R.randrange(20)}.{R.randrange(9)}-x86_64-linux.tar.gz")
    for i in range(30):
        lines.append(f"{hexs(32)}  ./assets/{pick(LOWER, 8)}.{R.choice(['png', 'css', 'js', 'woff2'])}")
    for i in range(30):
        lines.append(f"{hexs(40)} refs/heads/{R.choice(['main', 'release/2.14', 'feature/' + pick(LOWER, 6)])}")
    files["generated_ids.txt"] = lines

    lines = []
    for i in range(20):
        raw = bytes(R.getrandbits(8) for _ in range(R.choice([57, 114, 171])))
        lines.append(f'<img alt="icon" src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA{base64.b64encode(raw).decode()}">')
    for i in range(40):
        raw = bytes(R.getrandbits(8) for _ in range(57))
        lines.append(base64.b64encode(raw).decode())
    for i in range(40):
        pkg = R.choice(["lodash", "react", "express", "typescript", "@types/node", "esbuild", "vite"])
        lines.append(f'    "node_modules/{pkg}": {{ "version": "{R.randrange(1, 20)}.{R.randrange(30)}.{R.randrange(30)}", "resolved": "https://registry.npmjs.org/{pkg}/-/{pkg.split("/")[-1]}-4.17.21.tgz", "integrity": "sha512-{b64(64)}" }},')
    files["generated_encoded.txt"] = lines

    lines = []
    for i in range(80):
        lines.append(R.choice([
            f"https://github.com/acme/infra/pull/{R.randrange(5000)}/files#diff-{hexs(64)}",
            f"https://console.cloud.google.com/logs/query;query=resource.type%3D%22k8s_container%22;timeRange=PT1H?project=prod-{pick(LOWER, 6)}",
            f"https://s3.eu-central-1.amazonaws.com/acme-artifacts/builds/{uuid.UUID(int=R.getrandbits(128))}/app.tar.gz",
            f"https://grafana.example.com/d/{pick(ALNUM, 9)}/api-latency?orgId=1&from=now-6h&to=now&var-pod=api-{pick(LOWER + DIGITS, 5)}",
            f"git@github.com:acme/{pick(LOWER, 7)}.git",
            f"https://registry.example.com/v2/acme/api/manifests/sha256:{hexs(64)}",
            f"http://10.0.{R.randrange(256)}.{R.randrange(256)}:{R.randrange(1024, 65535)}/metrics",
            f"https://user@example.com/path?session_state={uuid.UUID(int=R.getrandbits(128))}",
            f"https://www.youtube.com/watch?v={pick(ALNUM + '_-', 11)}&t={R.randrange(600)}s",
        ]))
    for i in range(60):
        lines.append(R.choice([
            f"2026-12-04T{R.randrange(24):02d}:{R.randrange(60):02d}:{R.randrange(60):02d}.{R.randrange(10**9):09d}Z",
            f"Fri, 04 Dec 2026 {R.randrange(24):02d}:{R.randrange(60):02d}:{R.randrange(60):02d} GMT",
            f"{1764800000 + R.randrange(10**6)}.{R.randrange(10**6):06d}",
            f"[2026-12-04 {R.randrange(24):02d}:{R.randrange(60):02d}:{R.randrange(60):02d},{R.randrange(1000):03d}] INFO  request_id={uuid.UUID(int=R.getrandbits(128))} took {R.randrange(900)}ms",
        ]))
    files["generated_urls_times.txt"] = lines

    lines = ["USER         PID %CPU %MEM    VSZ   RSS TTY      STAT START   TIME COMMAND"]
    for i in range(50):
        lines.append(f"{R.choice(['root', 'www-data', 'postgres', 'deploy', 'redis']):<12} {R.randrange(1, 40000):>5} {R.random() * 9:4.1f} {R.random() * 5:4.1f} {R.randrange(10**4, 10**6):>6} {R.randrange(10**3, 10**5):>5} ?        Ss   Dec03   {R.randrange(60)}:{R.randrange(60):02d} {R.choice(['/usr/sbin/sshd -D', 'nginx: worker process', 'postgres: 16/main: checkpointer', '/usr/bin/dockerd -H fd:// --containerd=/run/containerd/containerd.sock', 'redis-server 127.0.0.1:6379', '/usr/local/bin/sshmode serve', 'python3 -m gunicorn app:app --workers 4 --bind 0.0.0.0:8000'])}")
    lines += [
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME=/home/deploy",
        "LANG=C.UTF-8",
        "SHELL=/bin/bash",
        "PASSWORD_STORE_DIR=/home/deploy/.password-store",
        "SSH_AUTH_SOCK=/tmp/ssh-XXXXabcd/agent.1234",
        "TOKEN_TTL_SECONDS=3600",
        "password_min_length = 12",
        "secret_backend: vault",
        "token_endpoint: https://auth.example.com/oauth2/token",
        "PasswordAuthentication no",
        "  password: ${DB_PASSWORD}",
        '  "password": null,',
        "api_key = <redacted>",
        "export GITHUB_TOKEN=$(cat ~/.config/gh/token)",
    ]
    files["generated_ps_env.txt"] = lines
    return files


def main():
    sec = cases()
    os.makedirs(os.path.join(HERE, "secrets"), exist_ok=True)
    with open(os.path.join(HERE, "secrets", "generated.jsonl"), "w") as f:
        for c in sec:
            f.write(json.dumps(c) + "\n")
    for name, lines in ordinary().items():
        with open(os.path.join(HERE, "ordinary", name), "w") as f:
            f.write("\n".join(lines) + "\n")
    print(f"{len(sec)} secrets")


if __name__ == "__main__":
    main()
