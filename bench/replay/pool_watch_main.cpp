#include "pool_watch.hpp"

int main(int argc, char** argv) { return vlake::bench::poolwatch_main(argc, argv); }
