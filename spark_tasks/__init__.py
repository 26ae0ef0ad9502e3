"""Spark for chronoq: the shared SparkSession (:func:`get_spark`), Spark jobs
(``@app.job(executor="spark")``, run by ``chronoq worker --executor spark``) and
the data pipelines (:mod:`spark_tasks.pipelines`).

Importing this package does not import pyspark: the session starts on first use.
"""

from spark_tasks.session import active_spark, get_spark, stop_spark

__all__ = ["active_spark", "get_spark", "stop_spark"]
