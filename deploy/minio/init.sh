#!/bin/sh
# One-shot MinIO setup (the minio-init service): the adapter bucket, and a cft user whose
# policy reaches only that bucket. Safe to re-run: it converges to the same state.
set -eu
: "${MINIO_ROOT_USER:?}" "${MINIO_ROOT_PASSWORD:?}" "${CFT_S3_BUCKET:?}"
: "${CFT_S3_ACCESS_KEY_ID:?}" "${CFT_S3_SECRET_ACCESS_KEY:?}"

mc alias set local http://minio:9000 "$MINIO_ROOT_USER" "$MINIO_ROOT_PASSWORD"
mc mb --ignore-existing "local/$CFT_S3_BUCKET"

if [ "$CFT_S3_ACCESS_KEY_ID" = "$MINIO_ROOT_USER" ]; then
  echo "CFT_S3_ACCESS_KEY_ID is the MinIO root user: no separate user created"
  exit 0
fi

cat > /tmp/cft-policy.json <<JSON
{
  "Version": "2012-10-17",
  "Statement": [
    {"Effect": "Allow", "Action": ["s3:GetBucketLocation", "s3:ListBucket"],
     "Resource": ["arn:aws:s3:::${CFT_S3_BUCKET}"]},
    {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
     "Resource": ["arn:aws:s3:::${CFT_S3_BUCKET}/*"]}
  ]
}
JSON
mc admin policy create local cft-adapters /tmp/cft-policy.json
mc admin user add local "$CFT_S3_ACCESS_KEY_ID" "$CFT_S3_SECRET_ACCESS_KEY"
# A re-run finds the policy already attached, which mc reports as an error.
mc admin policy attach local cft-adapters --user "$CFT_S3_ACCESS_KEY_ID" || true
echo "bucket $CFT_S3_BUCKET ready for user $CFT_S3_ACCESS_KEY_ID"
