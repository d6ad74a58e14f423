#include "alloc_bench.hpp"

int main(int argc, char** argv) { return vlake::bench::alloc_main(argc, argv); }
