// vlakectl: the operator's view of vlaked's node state. Everything lives in vlake::ctl.
#include "vlake/ctl/app.hpp"

int main(int argc, char** argv) { return vlake::ctl::main_entry(argc, argv); }
