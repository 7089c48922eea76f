"""Operator tools for running this image on Amazon SageMaker, checked offline before sending.

    sagemaker-ops train|register|deploy|transform [--dry-run] [--wait] ...

The shape everywhere is arguments -> typed config -> validated request -> print or send:

- `capabilities`  what the image supports (channels, content types, input modes, instance types)
- `hyperparameters`  the job's hyperparameters checked by the container's own parser, and the
                     algorithm's SupportedHyperParameters generated from the same definitions
- `metrics`       metric definitions for the trainer's per-epoch METRICS line
- `builders`      typed configs and the pure functions that turn them into request dicts
- `schema`        the check of each request against botocore's SageMaker model
- `aws`           the edge: boto3 clients, sending, following status and CloudWatch logs
- `cli`           the command line

See docs/sagemaker.md for the operator's view.
"""
