// The unit that builds the libtorch folders' precompiled header (harness/CMakeLists.txt).
