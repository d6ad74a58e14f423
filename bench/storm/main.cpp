#include "storm.hpp"

int main(int argc, char** argv) { return vlake::bench::storm_main(argc, argv); }
