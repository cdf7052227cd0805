"""The same Definitions as orchestration/definitions.py, run with one Kubernetes pod per step.

Point the code location at this file (`dagster api grpc -f deploy/k8s/refinery_k8s.py`, or the Helm
chart's dagsterApiGrpcArgs). Nothing else changes: assets, partitions and resources are the
embedded ones, and REFINERY_CONFIG names a config whose data_root is s3://...
"""

import dagster as dg
from dagster_k8s import k8s_job_executor

from orchestration.definitions import build_definitions
from orchestration.resources import config_path_from_env

defs = dg.Definitions.merge(build_definitions(config_path_from_env()), dg.Definitions(executor=k8s_job_executor))
