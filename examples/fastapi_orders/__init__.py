"""An order service on FastAPI whose unpaid orders close themselves: chronoq in a web app.

Three endpoints (:mod:`examples.fastapi_orders.app`): ``POST /orders`` stores an
order and schedules its auto-close (key ``order:<id>``, due
``ORDERS_CLOSE_AFTER_S`` seconds later, 30 minutes by default); ``POST
/orders/{id}/pay`` cancels the auto-close and accepts the payment when that
answered ``ABORTED`` (in time) or refuses it when it answered
``ALREADY_DELIVERED`` (too late); ``GET /orders/{id}`` shows the order and its
pending job. The auto-close job (:mod:`examples.fastapi_orders.jobs`) runs in a
separate dispatcher process and closes an order only while it is still open.

Orders live in SQLite under ``ORDERS_DATA_DIR`` (:mod:`examples.fastapi_orders.store`),
which every process can open; the broker is ``CHRONOQ_BROKER_URL``. Run it from the
checkout's root, with several web workers::

    export CHRONOQ_BROKER_URL=rocksdb://./chronoq-data ORDERS_DATA_DIR=./orders-data
    chronoq run examples.fastapi_orders.jobs:app &
    uvicorn examples.fastapi_orders.app:app --workers 2 --port 8000

Every process opens the same ``rocksdb://`` directory: the first one owns it and
the others become its clients over ``DIR/chronoq.sock``, in either start order.
"""
