#!/usr/bin/env bash
# Start a local S3-compatible server (moto) on 127.0.0.1 and print the environment the S3 tests
# need, as `export` lines:   eval "$(bash .ci/s3-server.sh)"
# Idempotent: an already running server on the port is reused.
set -euo pipefail

PORT="${S3_PORT:-5055}"
VENV="${LSMSEARCH_CI_VENV:-$HOME/.cache/lsmsearch-ci-venv}"
BUCKET="lsmsearch-test"
LOG="/tmp/lsmsearch-moto-${PORT}.log"

up() {
    python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:${PORT}/', timeout=1)" 2>/dev/null
}

if ! up; then
    if [ ! -x "$VENV/bin/moto_server" ]; then
        python3 -m venv "$VENV" >&2
        "$VENV/bin/pip" install --quiet --disable-pip-version-check "moto[server]==5.2.5" "boto3" >&2
    fi
    nohup "$VENV/bin/moto_server" -H 127.0.0.1 -p "$PORT" >"$LOG" 2>&1 &
    for _ in $(seq 1 100); do
        up && break
        sleep 0.2
    done
    up || { echo "moto_server did not start; see $LOG" >&2; exit 1; }
fi

export AWS_ENDPOINT="http://127.0.0.1:${PORT}" AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test \
       AWS_REGION=us-east-1 AWS_ALLOW_HTTP=true
"$VENV/bin/python" - "$BUCKET" >&2 <<'PY'
import os, sys, boto3, botocore
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT"], region_name="us-east-1")
bucket = sys.argv[1]
try:
    s3.create_bucket(Bucket=bucket)
except s3.exceptions.BucketAlreadyOwnedByYou:
    pass
# The index relies on conditional creates (If-None-Match: *): check the server honours them.
s3.put_object(Bucket=bucket, Key="_probe", Body=b"1")
try:
    s3.put_object(Bucket=bucket, Key="_probe", Body=b"2", IfNoneMatch="*")
    sys.exit("the S3 server ignored If-None-Match: * (conditional create)")
except botocore.exceptions.ClientError as e:
    assert e.response["Error"]["Code"] in ("PreconditionFailed", "412"), e.response
print("S3 server ready: conditional create refused with 412 as required", file=sys.stderr)
PY

cat <<ENV
export AWS_ENDPOINT=http://127.0.0.1:${PORT}
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1
export AWS_ALLOW_HTTP=true
export LSMSEARCH_TEST_S3=s3://${BUCKET}
ENV
