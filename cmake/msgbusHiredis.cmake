# hiredis as the imported target msgbus::hiredis. Debian's HiredisConfig.cmake (libhiredis-dev)
# sets HIREDIS_INCLUDE_DIRS and HIREDIS_LIBRARIES but defines no target, and its version file
# fails unless a version is asked for. Included by the
# project's CMakeLists.txt and by the installed msgbusConfig.cmake, which have found Hiredis.
if(NOT TARGET msgbus::hiredis)
  if(NOT HIREDIS_LIBRARIES OR NOT HIREDIS_INCLUDE_DIRS)
    find_package(Hiredis 0.14 CONFIG REQUIRED)
  endif()
  if(NOT HIREDIS_LIBRARIES OR NOT HIREDIS_INCLUDE_DIRS)
    message(FATAL_ERROR "hiredis: library or hiredis/hiredis.h not found (libhiredis-dev)")
  endif()
  add_library(msgbus::hiredis INTERFACE IMPORTED)
  set_target_properties(msgbus::hiredis PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${HIREDIS_INCLUDE_DIRS}"
    INTERFACE_LINK_LIBRARIES "${HIREDIS_LIBRARIES}")
endif()
