#include "launch_bench.hpp"

int main(int argc, char** argv) { return vlake::bench::launch_main(argc, argv); }
