#include "vlake/scheduler/events.hpp"

int main(int argc, char** argv) { return vlake::scheduler::events_main(argc, argv); }
