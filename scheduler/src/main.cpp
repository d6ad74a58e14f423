#include "vlake/scheduler/plugin.hpp"

int main(int argc, char** argv) { return vlake::scheduler::plugin_main(argc, argv); }
