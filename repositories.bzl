"""What a workspace that depends on this library declares in its WORKSPACE.

    load("@msgbus//:repositories.bzl", "msgbus_dependencies")
    msgbus_dependencies()

The library names its C++ dependencies by the repository names the ecosystem uses
(@com_google_absl, @com_google_googletest, @com_github_google_benchmark) and the upstream
target names within them (@com_google_absl//absl/strings, @com_google_googletest//:gtest_main,
...). msgbus_dependencies() declares each as a stand-in for the system library from Debian's
packages: a repository of BUILD files with those target names, carrying the link flags and
nothing else (the headers are in /usr/include). A workspace that builds Abseil, GoogleTest or
Benchmark from source declares that repository under the same name before calling
msgbus_dependencies(), and the library builds against it (docs/packaging.md).

Debian's bazel-bootstrap cannot download the rule sets that Bazel's own tools load (rules_cc,
rules_java, remote_coverage_tools). This repository carries small offline stand-ins for them in
third_party/bazel/, declared as repositories found relative to this repository wherever it is on
disk, whatever name the consumer gives it and however it was fetched (local_repository,
git_repository, http_archive).

A repository the consumer already declared under one of these names is left alone.
"""

_STAND_INS = ["rules_cc", "rules_java", "remote_coverage_tools"]

def _stand_in_impl(ctx):
    # The marker is a file of this repository's //third_party/bazel package; the stand-in is
    # the folder beside it, linked file by file into the new repository.
    src = ctx.path(ctx.attr.marker).dirname.get_child(ctx.attr.folder)
    for child in src.readdir():
        ctx.symlink(child, child.basename)

_stand_in = repository_rule(
    implementation = _stand_in_impl,
    attrs = {
        "folder": attr.string(mandatory = True),
        "marker": attr.label(allow_single_file = True, mandatory = True),
    },
    local = True,
)

# Abseil 20220623 (libabsl-dev), link flags from `pkg-config --libs` of absl_status
# absl_statusor absl_strings absl_str_format absl_cord absl_time absl_synchronization
# absl_flat_hash_map absl_flat_hash_set absl_node_hash_map absl_hash absl_random_random.
# The TSan build (--config=tsan, .bazelrc) links these names as static archives, where the order
# matters: every archive before the ones it uses, so the list is kept as one ordered line.
_ABSL_LINKOPTS = [
    "-labsl_statusor",
    "-labsl_status",
    "-labsl_strerror",
    "-labsl_str_format_internal",
    "-labsl_cord",
    "-labsl_cordz_info",
    "-labsl_cord_internal",
    "-labsl_cordz_functions",
    "-labsl_cordz_handle",
    "-labsl_hash",
    "-labsl_city",
    "-labsl_bad_variant_access",
    "-labsl_low_level_hash",
    "-labsl_raw_hash_set",
    "-labsl_hashtablez_sampler",
    "-labsl_exponential_biased",
    "-labsl_synchronization",
    "-labsl_graphcycles_internal",
    "-labsl_stacktrace",
    "-labsl_symbolize",
    "-labsl_debugging_internal",
    "-labsl_demangle_internal",
    "-labsl_malloc_internal",
    "-labsl_time",
    "-labsl_civil_time",
    "-labsl_time_zone",
    "-labsl_random_distributions",
    "-labsl_random_seed_sequences",
    "-labsl_random_internal_pool_urbg",
    "-labsl_random_internal_randen",
    "-labsl_random_internal_randen_hwaes",
    "-labsl_random_internal_randen_hwaes_impl",
    "-labsl_random_internal_randen_slow",
    "-labsl_random_internal_platform",
    "-labsl_random_internal_seed_material",
    "-labsl_random_seed_gen_exception",
    "-labsl_throw_delegate",
    "-labsl_bad_optional_access",
    "-labsl_strings",
    "-labsl_strings_internal",
    "-labsl_int128",
    "-labsl_base",
    # After every archive that logs (strings, base).
    "-labsl_raw_logging_internal",
    "-labsl_spinlock_wait",
    "-labsl_log_severity",
    "-lrt",
    "-latomic",
]

# pkg-config: absl_flags absl_flags_parse; before the rest of Abseil, which they use.
_ABSL_FLAGS_LINKOPTS = [
    "-labsl_flags_parse",
    "-labsl_flags_usage",
    "-labsl_flags_usage_internal",
    "-labsl_flags_internal",
    "-labsl_flags_marshalling",
    "-labsl_flags_reflection",
    "-labsl_flags_private_handle_accessor",
    "-labsl_flags_commandlineflag",
    "-labsl_flags_commandlineflag_internal",
    "-labsl_flags_config",
    "-labsl_flags_program_name",
]

# The upstream targets the library uses, by package: each one links the whole system Abseil
# (the "//:abseil" group below) or, for the flags, the flag libraries before it.
_ABSL_TARGETS = {
    "absl/base": ["core_headers", "endian"],
    "absl/cleanup": ["cleanup"],
    "absl/container": ["flat_hash_map", "flat_hash_set", "inlined_vector", "node_hash_map"],
    "absl/flags": ["commandlineflag", "flag", "parse", "reflection"],
    "absl/functional": ["function_ref"],
    "absl/hash": ["hash"],
    "absl/random": ["random"],
    "absl/status": ["status", "statusor"],
    "absl/strings": ["cord", "str_format", "strings"],
    "absl/synchronization": ["synchronization"],
    "absl/time": ["time"],
    "absl/types": ["span"],
}

_GTEST_BUILD = """
# GoogleTest 1.12 (libgtest-dev, libgmock-dev): :gtest carries gmock too, as upstream's does.
cc_library(
    name = "gtest",
    testonly = True,
    linkopts = ["-lgmock", "-lgtest", "-lpthread"],
)

cc_library(
    name = "gtest_main",
    testonly = True,
    linkopts = ["-lgtest_main"],
    deps = [":gtest"],
)
"""

_BENCHMARK_BUILD = """
# Google Benchmark 1.7 (libbenchmark-dev).
cc_library(
    name = "benchmark",
    linkopts = ["-lbenchmark", "-lpthread"],
)

cc_library(
    name = "benchmark_main",
    linkopts = ["-lbenchmark_main"],
    deps = [":benchmark"],
)
"""

_HEADER = """# Generated by msgbus_dependencies() (repositories.bzl): the system library from Debian's
# packages under its upstream target names. Headers are in /usr/include.
package(default_visibility = ["//visibility:public"])
"""

def _library(name, linkopts = [], deps = []):
    attrs = ["    name = %r," % name]
    if linkopts:
        attrs.append("    linkopts = %r," % linkopts)
    if deps:
        attrs.append("    deps = %r," % deps)
    return "\ncc_library(\n%s\n)\n" % "\n".join(attrs)

def _absl_files():
    files = {
        "BUILD.bazel": _HEADER + _library("abseil", linkopts = _ABSL_LINKOPTS) +
                       _library("abseil_flags", linkopts = _ABSL_FLAGS_LINKOPTS, deps = [":abseil"]),
    }
    for package, names in _ABSL_TARGETS.items():
        group = "//:abseil_flags" if package == "absl/flags" else "//:abseil"
        files[package + "/BUILD.bazel"] = _HEADER + "".join([
            _library(name, deps = [group])
            for name in names
        ])
    return files

def _system_library_impl(ctx):
    ctx.file("WORKSPACE", "workspace(name = %r)\n" % ctx.name)
    for path, content in ctx.attr.files.items():
        ctx.file(path, content)

_system_library = repository_rule(
    implementation = _system_library_impl,
    attrs = {"files": attr.string_dict(mandatory = True)},
    local = True,
)

def msgbus_dependencies():
    """Declares the system-library and offline stand-ins this library's build needs."""
    for name in _STAND_INS:
        if not native.existing_rule(name):
            _stand_in(
                name = name,
                folder = name,
                marker = Label("//third_party/bazel:BUILD.bazel"),
            )
    system = {
        "com_google_absl": _absl_files(),
        "com_google_googletest": {"BUILD.bazel": _HEADER + _GTEST_BUILD},
        "com_github_google_benchmark": {"BUILD.bazel": _HEADER + _BENCHMARK_BUILD},
    }
    for name, files in system.items():
        if not native.existing_rule(name):
            _system_library(name = name, files = files)
