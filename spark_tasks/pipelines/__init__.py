"""chronoq's data pipelines on Spark: pure ``DataFrame -> DataFrame`` functions and thin
runners.

* :mod:`~spark_tasks.pipelines.delivery_report`: lateness, throughput, retries and
  dead letters per topic and time bucket, from the delivery trace;
* :mod:`~spark_tasks.pipelines.bulk_schedule`: a CSV/Parquet dataset of rows
  becomes timed job messages (validated, rejects kept, idempotent by key).

Importing them does not import pyspark; calling them does.
"""
