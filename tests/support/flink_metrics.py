"""The Flink reporter's metrics the alert rules and the Grafana dashboard use; the feature job's test
(``tests/streams/test_feature_job.py``) checks the running job exports them."""

FLINK_METRICS = {
    "flink_taskmanager_job_task_operator_currentEmitEventTimeLag",
    "flink_taskmanager_job_task_operator_pendingRecords",
}
