"""What a workspace that depends on this library declares in its WORKSPACE.

    load("@msgbus//:repositories.bzl", "msgbus_dependencies")
    msgbus_dependencies()

Debian's bazel-bootstrap cannot download the rule sets that Bazel's own tools load (rules_cc,
rules_java, remote_coverage_tools). This repository carries small offline stand-ins for them in
third_party/bazel/; msgbus_dependencies() declares them as repositories, found relative to this
repository wherever it is on disk, whatever name the consumer gives it and however it was
fetched (local_repository, git_repository, http_archive). A repository the consumer already
declared under one of those names is left alone.

Every C++ dependency of the library is a system library from Debian's packages, wrapped in
//third_party, so nothing else is declared.
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

def msgbus_dependencies():
    """Declares the offline stand-ins this library's build needs."""
    for name in _STAND_INS:
        if not native.existing_rule(name):
            _stand_in(
                name = name,
                folder = name,
                marker = Label("//third_party/bazel:BUILD.bazel"),
            )
