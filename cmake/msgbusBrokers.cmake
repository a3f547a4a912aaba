# The brokers' C clients as imported targets, found with pkg-config (Debian's librdkafka-dev ships
# no CMake package; one way for all three): msgbus::rabbitmq_c (librabbitmq, the RabbitMQ
# driver), msgbus::rdkafka (librdkafka, the Kafka driver) and msgbus::cnats (libnats, the NATS
# driver). Included by the project's CMakeLists.txt and by the installed msgbusConfig.cmake.
find_package(PkgConfig REQUIRED)
foreach(pair IN ITEMS "rabbitmq_c:librabbitmq" "rdkafka:rdkafka" "cnats:libnats")
  string(REPLACE ":" ";" pair "${pair}")
  list(GET pair 0 name)
  list(GET pair 1 module)
  if(NOT TARGET msgbus::${name})
    pkg_check_modules(MSGBUS_PC_${name} REQUIRED IMPORTED_TARGET GLOBAL ${module})
    add_library(msgbus::${name} ALIAS PkgConfig::MSGBUS_PC_${name})
  endif()
endforeach()
