#include "replay_bench.hpp"

int main(int argc, char** argv) { return vlake::bench::replay_main(argc, argv); }
