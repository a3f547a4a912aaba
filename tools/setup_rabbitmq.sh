#!/usr/bin/env bash
# The RabbitMQ driver's test broker and client library (drivers/rabbitmq): Debian's
# rabbitmq-server 3.10 and librabbitmq-dev 0.11 (rabbitmq-c). Idempotent. The tests start the
# broker themselves as a process in a temporary directory, on their own ports and node names
# (tests/testing/rabbitmq_server.h), so a system service the package may run is left alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bash "$here/apt_install.sh" setup_rabbitmq rabbitmq-server librabbitmq-dev
test -x /usr/lib/rabbitmq/bin/rabbitmq-server
