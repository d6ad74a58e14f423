#include "start_bench.hpp"

int main(int argc, char** argv) { return vlake::bench::start_main(argc, argv); }
